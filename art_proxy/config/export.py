"""`art-proxy export` and `art-proxy scenario-bank`: what the store has recorded, as JSONL."""

from __future__ import annotations

from pydantic import Field

from art_proxy.config.shared import StoreSettings
from art_proxy.records import Split


class ExportSettings(StoreSettings):
    out: str = Field("-", description="File to write JSONL to (- = standard output).")
    scenario: str | None = Field(None, description="Only this scenario.")
    status: str | None = Field(
        None, description="Only trajectories in this status (open, finished)."
    )
    split: str | None = Field(None, description="Only this split (train, val, prod).")


class ScenarioBankSettings(StoreSettings):
    """`art-proxy scenario-bank`: the openings of recorded conversations as a scenarios file."""

    out: str = Field("-", description="Scenarios JSONL to write (- = standard output).")
    split: Split = Field("prod", description="Only scenarios with a trajectory of this split.")
    limit: int = Field(0, ge=0, description="At most this many scenarios, newest first (0 = all).")
