"""`art-proxy journal rejected|replay|drop`: the records a store refused, set aside by a proxy."""

from __future__ import annotations

from pydantic import Field

from art_proxy.config.proxy import JOURNAL_AUTO
from art_proxy.config.shared import StoreSettings


class RejectedSettings(StoreSettings):
    journal: str = Field(
        JOURNAL_AUTO,
        description="The proxy's --journal directory (auto: STORE.journal beside a SQLite store, "
        "else under $XDG_STATE_HOME/art-proxy/journals).",
    )


class HousekeepingSettings(RejectedSettings):
    """`art-proxy housekeeping`: what a proxy's --retain-days does, once."""

    retain_days: float = Field(
        gt=0,
        description="Delete trajectories (calls, feedback, judgments, openings) started more than "
        "this many days ago, and records set aside as long ago.",
    )


class ReplaySettings(RejectedSettings):
    pass


class DropSettings(RejectedSettings):
    yes: bool = Field(False, description="Drop them for good (without it: say what would go).")
