"""Erasure: whose records to delete, and what learned from them (the lineage an operator retrains
from). `art-proxy forget`, `POST /art/v1/forget` and `GET /art/v1/lineage` speak these."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import Field, field_validator, model_validator

from art_proxy.records.base import Record
from art_proxy.records.training import GroupOutcome, StepKind, StepStatus

MAX_SUBJECT_ID = 200  # the store's trajectories.user_id and tenant_id


def stored_subject_id(value: str) -> str:
    """A user or tenant id as the store keeps it: stripped, and where the store cannot keep it
    as it is (over the length, unprintable), its hash. The proxy files a call's id so and erasure
    looks the id up so, so erasure by the id a client sent finds what it sent."""
    value = value.strip()
    if len(value) > MAX_SUBJECT_ID or not value.isprintable():
        return "blake2b:" + hashlib.blake2b(value.encode(), digest_size=16).hexdigest()
    return value


class SubjectSelector(Record):
    """Exactly one of a user, a tenant and a trajectory; a user or tenant by the id the client
    sent or as stored (`stored_subject_id`)."""

    user: str | None = Field(default=None, min_length=1)
    tenant: str | None = Field(default=None, min_length=1)
    trajectory: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("user", "tenant")
    @classmethod
    def _as_stored(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("an id of blanks names no one")
        return stored_subject_id(value)

    @model_validator(mode="after")
    def _exactly_one(self) -> SubjectSelector:
        named = [value for value in (self.user, self.tenant, self.trajectory) if value is not None]
        if len(named) != 1:
            raise ValueError("name exactly one of user, tenant and trajectory")
        return self

    def describe(self) -> str:
        for name in ("user", "tenant", "trajectory"):
            value = getattr(self, name)
            if value is not None:
                return f"{name} {value!r}"
        raise AssertionError("validated: one is set")


# A step that has claimed the subject's groups and is training on them now (recorded later).
TRAINING = "training"


class LearnedAt(Record):
    """A training step that read one of the subject's groups."""

    run: str
    step: int
    kind: StepKind
    status: StepStatus | Literal["training"] = Field(
        description="`training`: the step holds the groups now and has recorded nothing yet."
    )
    adapter: str | None = Field(description="The adapter the step saved, if it saved one.")
    groups: dict[str, GroupOutcome | Literal["training"]] = Field(
        description="The subject's groups the step consumed, and what it did with each: "
        "`trained` ones moved the weights; `validation` ones only informed promotion; "
        "`training` ones it is training on now."
    )


class Lineage(Record):
    """What learned from a subject's trajectories, read from the store."""

    trajectories: list[str]
    groups: list[str] = Field(description="The groups the trajectories belong to.")
    steps: list[LearnedAt] = Field(description="Steps that consumed any of those groups.")
    derived_adapters: list[str] = Field(
        description="Every adapter saved by a run at or after its first step that trained on "
        "the subject: each continues from the weights before it, so each carries what was "
        "learned. These are what to retrain (or stop serving)."
    )
    training_runs: list[str] = Field(
        default_factory=list,
        description="Runs with a step training on the subject's groups as this was read: the "
        "adapter that step saves, and each its run saves after, learn from them too (none of "
        "them has a name yet).",
    )


class Erasure(Record):
    """What `forget` deleted, and the lineage read just before."""

    subject: str
    lineage: Lineage
    deleted: dict[str, int] = Field(
        description="Rows deleted by table (scenarios: openings cleared or deleted)."
    )
    journal_frames_dropped: int = Field(
        default=0, description="Records set aside in the journal's rejected-records, dropped."
    )
    quarantined_files_dropped: int = Field(
        default=0,
        description="Files of damaged journal bytes (the journal's quarantine) that named the "
        "subject, deleted.",
    )
