"""The rows the proxy hands the store's writer, typed once.

The proxy builds them (proxy/tracker.py, proxy/recording.py) and the group-commit writer applies
them (writer.py) kind by kind with one `executemany` per statement and set of keys: every row of a
kind carries every key of its TypedDict, so a transaction's rows of one kind share one statement.
TypedDicts are plain dicts at run time: typing them costs the hot path nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum
from typing import NotRequired, TypedDict

from art_proxy.records import JsonObject


class RowKind(IntEnum):
    """Kinds of rows, in the order a transaction applies them (foreign keys first)."""

    scenario = 0
    group = 1
    trajectory = 2
    call = 3
    touch = 4  # bump a trajectory's call_count and updated_at, move its tip when answered
    judgment = 5  # a group judged as it was recorded (best-of-N at serve time, best_of.py)


class ScenarioRow(TypedDict):
    id: str
    created_at: datetime
    auto: bool
    opening: list[JsonObject]


class GroupRow(TypedDict):
    id: str
    scenario_id: str
    created_at: datetime


class TrajectoryRow(TypedDict):
    id: str
    scenario_id: str
    group_id: str
    split: str
    status: str
    finish_reason: str | None
    finished_at: datetime | None
    created_at: datetime
    updated_at: datetime
    upstream: str
    call_count: int
    tip_key: str | None
    tip_prompt_key: str | None
    metrics: dict[str, float]
    metadata: JsonObject
    # Absent from a record journaled before subjects were recorded (stored as NULL).
    user_id: NotRequired[str | None]
    tenant_id: NotRequired[str | None]


class CallRow(TypedDict):
    id: str
    trajectory_id: str
    seq: int
    kind: str
    created_at: datetime
    latency_ms: float
    upstream: str
    status: str
    http_status: int
    error: str | None
    stream: bool
    model: str | None
    request: JsonObject
    response: JsonObject | None
    sampling: JsonObject
    prompt_token_ids: list[int] | None
    completion_token_ids: list[list[int]] | None
    logprobs: list[list[float]] | None
    trainable: bool
    untrainable_reason: str | None
    stitched: bool
    attribution: str
    continuation_key: str | None
    dialect: str
    client_request: JsonObject | None
    # Absent from a record journaled before guided calls were recorded (stored as NULL).
    guidance: NotRequired[JsonObject | None]


class TouchRow(TypedDict):
    """A later call of a trajectory: its count and time, and its tips when the call was answered
    (None keeps the old ones). The keys are the UPDATE's bind names: SQLAlchemy reserves the
    column names for the SET clause."""

    b_id: str
    b_now: datetime
    b_tip: str | None
    b_prompt: str | None


class JudgmentRow(TypedDict):
    """records.Judgment as its table stores it (store/judgments.py `judgment_row`)."""

    id: str
    group_id: str
    judge_model: str
    mode: str
    rubric_hash: str
    cache_key: str
    status: str
    reason: str | None
    trajectory_ids: list[str]
    scores: list[JsonObject]
    attempts: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    cached_from: str | None
    created_at: datetime
    members: list[JsonObject]
    rank_agreement: float | None
    reward_rule: str
    # Absent from a record journaled before judgments in several orders (stored as NULL).
    order_agreement: NotRequired[float | None]


Row = ScenarioRow | GroupRow | TrajectoryRow | CallRow | TouchRow | JudgmentRow


@dataclass(frozen=True)
class Batch:
    """The rows of one recorded event; committed together or not at all."""

    rows: Sequence[tuple[RowKind, Row]]


# The datetime fields of each kind: JSON carries them as ISO 8601 text (the journal's frames).
TIME_FIELDS: dict[RowKind, tuple[str, ...]] = {
    RowKind.scenario: ("created_at",),
    RowKind.group: ("created_at",),
    RowKind.trajectory: ("created_at", "updated_at", "finished_at"),
    RowKind.call: ("created_at",),
    RowKind.touch: ("b_now",),
    RowKind.judgment: ("created_at",),
}


@dataclass(frozen=True)
class NewTrajectoryRows:
    """What creating a trajectory writes: its scenario and group rows (idempotent inserts: either
    may exist already) and its own row; for a group judged as it was recorded, the judgment
    (with one of its members: the group row is all it needs before it)."""

    scenario: ScenarioRow
    group: GroupRow
    trajectory: TrajectoryRow
    judgment: JudgmentRow | None = None

    def pairs(self) -> list[tuple[RowKind, Row]]:
        pairs: list[tuple[RowKind, Row]] = [
            (RowKind.scenario, self.scenario),
            (RowKind.group, self.group),
            (RowKind.trajectory, self.trajectory),
        ]
        if self.judgment is not None:
            pairs.append((RowKind.judgment, self.judgment))
        return pairs
