"""A call's first stage: the client's body, read and translated from its dialect into the chat (or
legacy completions) body that goes upstream (OpenAI's as it is; the Responses and Messages APIs by
their dialects/), or the reason it is refused."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from art_proxy.errors import BadRequest
from art_proxy.privacy.subjects import Subject, continuing, may_read, subject_of
from art_proxy.records import CallKind, Dialect, JsonObject

from .dialects import anthropic, responses
from .request_body import Rejection, body_too_large, check_body, load_body, parse_body

# A recorded call's row by its id (a Responses call's `previous_response_id`), once this proxy's
# own records before it are in the store, where the subject given may read it (else None, as for
# an id not in the store: `Lookups.readable_call`).
StoredCall = Callable[[str, Subject], Awaitable[JsonObject | None]]


@dataclass(frozen=True)
class Translated:
    """A request ready to go upstream: its chat (or legacy completions) body, and for another
    dialect the client's own body and the trajectory a `previous_response_id` names."""

    body: JsonObject
    client: JsonObject | None = None
    continues: str | None = None
    owner: Subject | None = None  # whose `continues` is (responses.ChatRequest)


async def read_body(request: web.Request) -> bytes | Rejection:
    """The raw body; one that is too large or cannot be decoded is refused."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return Rejection(body_too_large(request.client_max_size), None, False)
    except RequestPayloadError:
        encoding = request.headers.get("Content-Encoding")
        reason = f"is not valid {encoding}" if encoding else "could not be read"
        return Rejection(
            BadRequest(f"request body {reason}", param="Content-Encoding"), None, False
        )


async def loaded_body(request: web.Request) -> JsonObject:
    """A body that is only read (a count): its JSON object, or `BadRequest`."""
    raw = await read_body(request)
    loaded = raw if isinstance(raw, Rejection) else load_body(raw)
    if isinstance(loaded, Rejection):
        raise loaded.error
    return loaded


async def translate(
    raw: bytes,
    kind: CallKind,
    dialect: Dialect,
    stored_call: StoredCall,
    headers: Mapping[str, str],
) -> Translated | Rejection:
    """The body to send upstream, from the client's in its dialect; a stored response it
    continues, looked up as its subject (`headers`, the body) may read it."""
    if dialect == "openai":
        parsed = parse_body(raw, kind)
        return parsed if isinstance(parsed, Rejection) else Translated(parsed)
    loaded = load_body(raw)
    if isinstance(loaded, Rejection):
        return loaded
    try:
        if dialect == "responses":
            reader = subject_of(headers, loaded)
            done = await responses.translate(loaded, lambda call: stored_call(call, reader))
            chat, continues, owner = done.chat, done.continues, done.owner
        else:
            chat, continues, owner = anthropic.translate(loaded), None, None
    except BadRequest as exc:
        return Rejection(exc, loaded, messages_valid=False)
    checked = check_body(chat, "chat")
    if isinstance(checked, Rejection):  # what the client sent inside the items, e.g. a role
        return Rejection(checked.error, loaded, messages_valid=False)
    return Translated(chat, client=loaded, continues=continues, owner=owner)


def subject_of_call(translated: Translated, headers: Mapping[str, str]) -> Subject:
    """Whose call `translated` is (`subject_of` its headers and body); continuing a stored
    answer, the answer's owner's where it names none (`continuing`), and `BadRequest` where its
    subject may not read that answer (`check_reader`)."""
    client = translated.client or translated.body
    subject = subject_of(headers, client)
    check_reader(translated.owner, subject, client)
    return continuing(subject, translated.owner)


def check_reader(owner: Subject | None, reader: Subject, body: JsonObject) -> None:
    """`BadRequest` when `body` continues a stored response (`previous_response_id`) of `owner`
    that `reader` may not read: as for one that does not exist, so that nothing is told of
    another user's or tenant's."""
    if owner is not None and not may_read(reader, owner):
        raise responses.previous_not_found(str(body.get("previous_response_id")))
