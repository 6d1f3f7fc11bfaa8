"""`art-proxy alias list|set|reset`: the stable model names agents call, and what they serve."""

from __future__ import annotations

from pydantic import Field

from art_proxy.config.shared import ARGUMENT, StoreSettings, UpstreamSettings
from art_proxy.records.training import MAX_NOTE


class AliasListSettings(StoreSettings):
    pass


class AliasHistorySettings(StoreSettings):
    alias: str | None = Field(
        None, description="One alias's moves (unset: every alias's).", json_schema_extra=ARGUMENT
    )
    limit: int = Field(20, ge=1, le=1000, description="The newest this many moves.")


class AliasSetSettings(StoreSettings):
    alias: str = Field(description="The name agents call.", json_schema_extra=ARGUMENT)
    model: str = Field(
        description="What the upstream serves it as: the base model or an adapter it has loaded.",
        json_schema_extra=ARGUMENT,
    )
    step: int | None = Field(None, description="The training step of the adapter, if one.")
    note: str | None = Field(None, max_length=MAX_NOTE, description="Why, kept with the move.")


class AliasResetSettings(UpstreamSettings, StoreSettings):
    alias: str = Field(description="The name agents call.", json_schema_extra=ARGUMENT)
