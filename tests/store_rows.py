"""Typed rows for tests that seed a store directly, as the proxy would have written them
(art_proxy/store/rows.py); each builder fills what the proxy fills and takes the rest."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from art_proxy.records import JsonObject
from art_proxy.store.rows import CallRow, GroupRow, Row, RowKind, ScenarioRow, TrajectoryRow

UPSTREAM = "http://upstream/v1"


def scenario_row(scenario_id: str, at: datetime) -> tuple[RowKind, Row]:
    row: ScenarioRow = {"id": scenario_id, "created_at": at, "auto": False, "opening": []}
    return RowKind.scenario, row


def group_row(group_id: str, scenario_id: str, at: datetime) -> tuple[RowKind, Row]:
    row: GroupRow = {"id": group_id, "scenario_id": scenario_id, "created_at": at}
    return RowKind.group, row


def trajectory_row(
    trajectory_id: str,
    scenario_id: str,
    group_id: str,
    at: datetime,
    *,
    split: str = "train",
    finished_at: datetime | None = None,
    call_count: int = 0,
    upstream: str = UPSTREAM,
    finish_reason: str = "client",
    metadata: JsonObject | None = None,
) -> tuple[RowKind, Row]:
    """An open trajectory, or one finished at `finished_at` (by its client, unless told)."""
    row: TrajectoryRow = {
        "id": trajectory_id,
        "scenario_id": scenario_id,
        "group_id": group_id,
        "split": split,
        "status": "open" if finished_at is None else "finished",
        "finish_reason": None if finished_at is None else finish_reason,
        "finished_at": finished_at,
        "created_at": at,
        "updated_at": finished_at or at,
        "upstream": upstream,
        "call_count": call_count,
        "tip_key": None,
        "tip_prompt_key": None,
        "metrics": {},
        "metadata": metadata or {},
    }
    return RowKind.trajectory, row


def call_row(trajectory_id: str, at: datetime, **fields: Any) -> tuple[RowKind, Row]:
    """An answered chat call (seq 0, no tokens) with `fields` replacing the defaults."""
    row: CallRow = {
        "id": uuid.uuid4().hex,
        "trajectory_id": trajectory_id,
        "seq": 0,
        "kind": "chat",
        "created_at": at,
        "latency_ms": 1.0,
        "upstream": UPSTREAM,
        "status": "ok",
        "http_status": 200,
        "error": None,
        "stream": False,
        "model": "agent",
        "request": {},
        "response": None,
        "sampling": {},
        "prompt_token_ids": None,
        "completion_token_ids": None,
        "logprobs": None,
        "trainable": False,
        "untrainable_reason": None,
        "stitched": False,
        "attribution": "url",
        "continuation_key": None,
        "dialect": "openai",
        "client_request": None,
    }
    unknown = set(fields) - set(CallRow.__annotations__)
    assert not unknown, f"not call columns: {sorted(unknown)}"
    row.update(fields)  # type: ignore[typeddict-item]  # keys checked above
    return RowKind.call, row


def conversation_call(
    trajectory_id: str, conversation: list[JsonObject], at: datetime
) -> tuple[RowKind, Row]:
    """A call whose request holds `conversation` but its last message, and whose reply is it."""
    return call_row(
        trajectory_id,
        at,
        request={"model": "agent", "messages": conversation[:-1]},
        response={"choices": [{"index": 0, "message": conversation[-1]}]},
    )
