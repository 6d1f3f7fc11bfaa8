"""Groups written straight into a store, shaped as the proxy records them (one chat call each)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta

from art_proxy.records import FinishRequest, JsonObject
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.store.writer import Batch
from tests.store_rows import conversation_call, group_row, scenario_row, trajectory_row

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
    rows = [scenario_row(scenario, started), group_row(group, scenario, started)]
    ids = []
    for index, conversation in enumerate(conversations):
        trajectory = f"{group[:8]}-{index}"
        ids.append(trajectory)
        created = started + timedelta(seconds=index)
        rows.append(trajectory_row(trajectory, scenario, group, created, call_count=1))
        rows.append(conversation_call(trajectory, list(conversation), started))
    await store.write(Batch(rows))
    for index, trajectory in enumerate(ids):
        if finished is None or finished[index]:  # as the agent finishes them, with its reward
            reward = rewards[index] if rewards is not None else None
            await store.finish(trajectory, FinishRequest(reward=reward))
    return group, ids


def answered(text: str) -> list[JsonObject]:
    """The opening, answered with `text`."""
    return [*OPENING, {"role": "assistant", "content": text}]
