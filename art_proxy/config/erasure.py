"""`art-proxy forget` and `art-proxy lineage`: a subject's records, erased or traced."""

from __future__ import annotations

from pydantic import Field, ValidationError, model_validator

from art_proxy.config.journal import RejectedSettings
from art_proxy.records import SubjectSelector


class LineageSettings(RejectedSettings):
    user: str | None = Field(None, description="The user (X-Art-User, or the body's user field).")
    tenant: str | None = Field(None, description="The tenant (X-Art-Tenant).")
    trajectory: str | None = Field(None, description="One trajectory, by id.")

    @model_validator(mode="after")
    def _one_subject(self) -> LineageSettings:
        try:
            self.subject()
        except ValidationError as exc:
            raise ValueError("pass exactly one of --user, --tenant and --trajectory") from exc
        return self

    def subject(self) -> SubjectSelector:
        return SubjectSelector(user=self.user, tenant=self.tenant, trajectory=self.trajectory)


class ForgetSettings(LineageSettings):
    yes: bool = Field(
        False, description="Delete for good (without it: say what would go, and what learned)."
    )
