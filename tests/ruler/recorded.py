"""Groups written straight into a store, shaped as the proxy records them (one chat call each)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from art_proxy.records import JsonObject
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.store.writer import Batch, RowKind

OPENING: list[JsonObject] = [
    {"role": "system", "content": "You are a careful assistant. " * 20},
    {"role": "user", "content": "What is the capital of France? Answer in one word."},
]


async def record_group(
    store: TrajectoryStore,
    conversations: Sequence[Sequence[JsonObject]],
    *,
    finished: Sequence[bool] | None = None,
    rewards: Sequence[float | None] | None = None,
    started_ago_s: float = 3600.0,
) -> tuple[str, list[str]]:
    """A group of trajectories whose final conversations are `conversations` (and whose agent
    reported `rewards` at finish); its id and theirs."""
    now = utcnow()
    started = now - timedelta(seconds=started_ago_s)
    scenario, group = f"s-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rows: list[tuple[RowKind, dict[str, Any]]] = [
        (RowKind.scenario, {"id": scenario, "created_at": started, "auto": False, "opening": []}),
        (RowKind.group, {"id": group, "scenario_id": scenario, "created_at": started}),
    ]
    ids = []
    for index, conversation in enumerate(conversations):
        trajectory = f"{group[:8]}-{index}"
        ids.append(trajectory)
        done = finished[index] if finished is not None else True
        rows.append(
            (
                RowKind.trajectory,
                {
                    "id": trajectory,
                    "scenario_id": scenario,
                    "group_id": group,
                    "split": "train",
                    "status": "finished" if done else "open",
                    "finish_reason": "client" if done else None,
                    "created_at": started + timedelta(seconds=index),
                    "updated_at": now,
                    "finished_at": now if done else None,
                    "upstream": "http://upstream/v1",
                    "call_count": 1,
                    "reward": rewards[index] if rewards is not None else None,
                    "metrics": {},
                    "metadata": {},
                },
            )
        )
        rows.append((RowKind.call, _call(trajectory, list(conversation), started)))
    await store.write(Batch(rows))
    return group, ids


def _call(trajectory: str, conversation: list[JsonObject], at: Any) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "trajectory_id": trajectory,
        "seq": 0,
        "kind": "chat",
        "created_at": at,
        "latency_ms": 1.0,
        "upstream": "http://upstream/v1",
        "status": "ok",
        "http_status": 200,
        "stream": False,
        "model": "agent",
        "request": {"model": "agent", "messages": conversation[:-1]},
        "response": {"choices": [{"index": 0, "message": conversation[-1]}]},
        "sampling": {},
        "trainable": False,
        "stitched": False,
        "attribution": "url",
    }


def answered(text: str) -> list[JsonObject]:
    """The opening, answered with `text`."""
    return [*OPENING, {"role": "assistant", "content": text}]
