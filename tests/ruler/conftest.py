"""Fixtures for RULER: a store to record groups in, and rulers pointed at a scripted judge."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from art_proxy.ruler.judge import LitellmJudge
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.scorer import Ruler, RulerSettings
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.scripted_judge import ScriptedJudge

JUDGE_MODEL = "openai/scripted-judge"
MakeRuler = Callable[..., Ruler]


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[TrajectoryStore]:
    opened = await TrajectoryStore.open(sqlite_url)
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def make_ruler(store: TrajectoryStore) -> AsyncIterator[MakeRuler]:
    """`make_ruler(judge, **settings)`: a Ruler over `store` asking the scripted `judge`."""
    clients: list[LitellmJudge] = []

    def make(judge: ScriptedJudge | str, **settings: Any) -> Ruler:
        base_url = judge if isinstance(judge, str) else judge.base_url
        client = LitellmJudge(JUDGE_MODEL, base_url=base_url, timeout=10)
        clients.append(client)
        settings = {"rubric": DEFAULT_RUBRIC, "backoff": 0.01, **settings}
        return Ruler(client, store, RulerSettings(**settings))

    yield make
    for client in clients:
        await client.aclose()
