"""Whose conversation a call belongs to: the user and the tenant a trajectory is recorded under.

An application that knows its user says so with `X-Art-User` (and `X-Art-Tenant` for the customer
it serves); otherwise the request's own field is taken: OpenAI's `safety_identifier`, else its
older `user`, or Anthropic's `metadata.user_id`. A trajectory keeps the subject of the call that
opened it. Retention, erasure (`art-proxy forget`) and the lists' filters go by these ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDictProxy

from art_proxy.errors import BadRequest
from art_proxy.records.erasure import MAX_SUBJECT_ID as _MAX_LENGTH
from art_proxy.records.erasure import stored_subject_id

USER_HEADER, TENANT_HEADER = "X-Art-User", "X-Art-Tenant"


@dataclass(frozen=True)
class Subject:
    user: str | None = None
    tenant: str | None = None


NO_SUBJECT = Subject()


def subject_of_row(row: Mapping[str, Any]) -> Subject:
    """The subject of a stored trajectory row (none before migration 0015)."""
    return Subject(row.get("user_id"), row.get("tenant_id"))


def may_read(reader: Subject, owner: Subject) -> bool:
    """Whether a request of `reader` may read what was recorded under `owner` (a stored
    Responses answer): the reader's tenant must be the owner's, none where it has none (a
    tenant's application reading a tenantless user's answer is another tenant reading it); a
    user the reader names must be the owner's, where it has one. A reader that names no user
    reads as the tenant's application: a chain may name its user on its first call only, and the
    SDKs have no user field on a retrieve or a count; continued so, a call joins the owner's
    trajectory, and its erasure."""
    return owner.tenant == reader.tenant and (
        reader.user is None or owner.user in (None, reader.user)
    )


def continuing(reader: Subject, owner: Subject | None) -> Subject:
    """The subject of a call that continues a stored answer of `owner` (`may_read`): the owner's
    where the reader names none, since it holds the owner's conversation; erasing the owner
    takes it, in the owner's trajectory or a new one (the owner's was finished)."""
    if owner is None:
        return reader
    return Subject(reader.user or owner.user, reader.tenant or owner.tenant)


def subject_of(
    headers: Mapping[str, str], body: Mapping[str, Any] | None, *, refused: bool = False
) -> Subject:
    """The subject the headers name, else the body's user field; `BadRequest` for a header that
    is empty, unprintable or longer than the store keeps. `refused`: a refused request's, whose
    record is erased with its subject: what of it can be read, a bad header read as none."""

    def header(name: str) -> str | None:
        try:
            return _header(headers, name)
        except BadRequest:
            if not refused:
                raise
            return None

    user = header(USER_HEADER)
    if user is None and body is not None:
        user = _body_user(body)
    return Subject(user, header(TENANT_HEADER))


def _header(headers: Mapping[str, str], name: str) -> str | None:
    values = headers.getall(name, []) if isinstance(headers, CIMultiDictProxy) else None
    if values is not None and len(values) > 1:
        # Behind a gateway that appends its own, the first is the client's: taken, one tenant
        # read another's answers.
        raise BadRequest(
            f"{name} sent {len(values)} times: send it once (a gateway that sets it must "
            "replace the client's, not add to it)"
        )
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > _MAX_LENGTH or not value.isprintable():
        raise BadRequest(f"{name} must be 1 to {_MAX_LENGTH} printable characters")
    return value


def _body_user(body: Mapping[str, Any]) -> str | None:
    """The body's user id, stripped as a header's is. One the store cannot keep as it is (over
    the length, unprintable) is kept as its hash: refusing a body the vendors accept would break
    the agent, and erasure by the same id hashes it alike (`stored_subject_id`)."""
    metadata = body.get("metadata")
    candidates = (
        body.get("safety_identifier"),
        body.get("user"),
        metadata.get("user_id") if isinstance(metadata, dict) else None,
    )
    value = next((c for c in candidates if isinstance(c, str) and c.strip()), None)
    return None if value is None else stored_subject_id(value)
