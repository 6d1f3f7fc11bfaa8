"""Fixtures for RULER: a store to record groups in, and rulers pointed at a scripted judge."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from art_proxy.privacy.pii import PiiRedactor
from art_proxy.ruler.judge import LitellmJudge
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.scorer import Ruler
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.scripted_judge import ScriptedJudge

JUDGE_MODEL = "openai/scripted-judge"
MakeRuler = Callable[..., Ruler]


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[TrajectoryStore]:
    async with TrajectoryStore.opened(sqlite_url) as opened:
        yield opened


@pytest.fixture
async def make_ruler(store: TrajectoryStore) -> AsyncIterator[MakeRuler]:
    """`make_ruler(judge, redactor=None, **settings)`: a Ruler over `store` asking the scripted
    `judge` (its groups redacted by `redactor`); given
    several judges, an ensemble of them named `JUDGE_MODEL-1`, `JUDGE_MODEL-2`..."""
    clients: list[LitellmJudge] = []

    def make(
        judge: ScriptedJudge | str | Sequence[ScriptedJudge | str],
        *,
        redactor: PiiRedactor | None = None,
        **settings: Any,
    ) -> Ruler:
        judges = [judge] if isinstance(judge, ScriptedJudge | str) else list(judge)
        ensemble = []
        for index, one in enumerate(judges, 1):
            base_url = one if isinstance(one, str) else one.base_url
            model = JUDGE_MODEL if len(judges) == 1 else f"{JUDGE_MODEL}-{index}"
            ensemble.append(LitellmJudge(model, base_url=base_url, timeout=10))
        clients.extend(ensemble)
        settings = {"rubric": DEFAULT_RUBRIC, "backoff": 0.01, **settings}
        return Ruler(ensemble, store, RulerSettings(**settings), redactor=redactor)

    yield make
    for client in clients:
        await client.aclose()
