"""A canary on a tiny stack: local-llm, the proxy splitting the production alias, the promoter
deciding on live rewards, and the off-policy gate scoring the shadow samples the target drew.

The candidate is a fresh LoRA adapter (B = 0: the base model's weights exactly), so its
off-policy estimate on the shadow samples must be their own mean with every weight 1; the live
arms are rated by which adapter answered, so the candidate is clearly better.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from art_proxy.local.model_loading import load_model
from art_proxy.local.served import ServedModel
from art_proxy.local.server import running_local_llm
from art_proxy.proxy.server import running_proxy
from art_proxy.records import FeedbackRequest
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy_trainer.canary import CanaryPolicy
from art_proxy_trainer.checkpoint import TrainerState
from art_proxy_trainer.promoter import Promoter
from art_proxy_trainer.swap import AdapterSwapper
from tests.conftest import proxy_settings
from tests.trainer.agents import untagged
from tests.trainer.conftest import TINY_NAME, Stack
from tests.trainer.test_promotion_loop import AT, PROD, _adapter, swapper_for
from tests.trainer.test_training_loop import _models

SHADOWS = 2  # per served call


@pytest.fixture
async def shadowed(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[Stack]:
    """The training stack, with every served prod call sampled again (the gate's evidence)."""
    served = ServedModel.create(
        load_model(str(tiny_model_dir)), served_model_name=TINY_NAME, max_batch_size=32
    )
    store_url = f"sqlite:///{tmp_path / 'art.db'}"
    async with running_local_llm(served) as llm:
        settings = proxy_settings(
            store_url,
            llm.base_url,
            shadow_fraction=1.0,
            shadow_samples=SHADOWS,
            shadow_max_in_flight=64,
        )
        async with running_proxy(settings) as proxy:
            yield Stack(llm, proxy, store_url, tiny_model_dir)


@dataclass
class Harness:
    """The tiny stack's store, a client, the adapter swapper and a started promoter."""

    store: TrajectoryStore
    http: aiohttp.ClientSession
    swapper: AdapterSwapper
    promoter: Promoter
    state: TrainerState

    async def swap_candidate(self, stack: Stack, out: Path) -> None:
        """Step 1's adapter (B = 0: the base's weights), loaded and the training alias on it."""
        assert (await self.swapper.swap(1, _adapter(stack.model_dir, out))).status == "swapped"


@asynccontextmanager
async def harness(
    stack: Stack, policy: CanaryPolicy, *, upstream: str | None = None
) -> AsyncIterator[Harness]:
    async with (
        TrajectoryStore.opened(stack.store_url, writer=False) as store,
        aiohttp.ClientSession() as http,
        swapper_for(stack) as swapper,
    ):
        await swapper.check_base_model({TINY_NAME})
        promoter = Promoter(
            PROD,
            store,
            swapper,
            min_trajectories=4,
            margin=0.05,
            canary=policy,
            upstream=upstream,
        )
        await promoter.start()
        yield Harness(
            store, http, swapper, promoter, TrainerState(run="run", validated={TINY_NAME: 0.5})
        )


async def _call(
    http: aiohttp.ClientSession, stack: Stack, trajectory: str, **sampling: float
) -> str:
    """One production call of a new conversation; the model that answered it."""
    headers = {"X-Art-Trajectory": trajectory, "X-Art-Split": "prod"}
    body = {"model": PROD, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with http.post(
        f"{stack.proxy.base_url}/chat/completions",
        json={**body, **sampling},
        headers=headers,
    ) as response:
        assert response.status == 200, await response.text()
        return str((await response.json())["model"])


async def _finish(
    http: aiohttp.ClientSession, stack: Stack, trajectory: str, reward: float
) -> None:
    admin = f"{stack.proxy.root_url}/art/v1"
    finish = {"reward": reward}
    async with http.post(f"{admin}/trajectories/{trajectory}/finish", json=finish) as response:
        assert response.status == 200, await response.text()


async def test_a_canary_is_gated_off_policy_split_sticky_and_promoted_on_live_rewards(
    shadowed: Stack, tmp_path: Path
) -> None:
    stack = shadowed
    policy = CanaryPolicy(fractions=(0.5,), alpha=0.05, min_effect=0.05, gate_samples=64)
    async with harness(stack, policy, upstream=stack.llm.base_url) as h:
        store, http, promoter, state = h.store, h.http, h.promoter, h.state
        # Before the candidate: the base serves production, and each call is sampled again.
        for index in range(6):
            assert await _call(http, stack, f"before-{index}") == TINY_NAME
            await _finish(http, stack, f"before-{index}", 0.5)
        # Sampled at another temperature, or greedily: their shadow samples cannot be reweighed.
        await _call(http, stack, "warm", temperature=0.7)
        await _finish(http, stack, "warm", 0.5)
        await _call(http, stack, "greedy", temperature=0)
        await _finish(http, stack, "greedy", 0.5)
        shadows: list[str] = []
        for _ in range(100):
            trajectories = await store.trajectories(split="prod", limit=100)
            shadows = sorted(t.id for t in trajectories if t.finish_reason == "shadow")
            if len(shadows) == 8 * SHADOWS:
                break
            await asyncio.sleep(0.1)
        assert len(shadows) == 8 * SHADOWS
        for index, trajectory in enumerate(shadows):  # rated as a judge would rate them
            rated = FeedbackRequest(trajectory_id=trajectory, score=index % 2, as_reward=True)
            await store.add_feedback(rated)

        await h.swap_candidate(stack, tmp_path / "a1")
        started = untagged(await promoter.consider({AT[1]: 0.6}, state) or "")
        assert started.startswith(f"canary {AT[1]} on 50% of {PROD}'s new trajectories")
        # The same weights: every weight 1, the estimate the samples' own mean.
        assert "off-policy 0.50 from 12 shadow samples (effective 12.0, 0 weights truncated)" in (
            started
        )
        assert "vs 0.50 on-policy" in started and "4 samples could not be reweighed" in started

        # Live: each new conversation on its arm, rated by which adapter answered it.
        served: dict[str, str] = {}
        for index in range(60):
            trajectory = f"live-{index}"
            served[trajectory] = await _call(http, stack, trajectory)
            if index < 8:  # a conversation's next call stays on its arm
                assert await _call(http, stack, trajectory) == served[trajectory]
            await _finish(http, stack, trajectory, 1.0 if served[trajectory] != TINY_NAME else 0.0)
            if (said := await promoter.watch(state)) is not None:
                break
            if index == 12:  # 13 scored: too few on an arm to decide, shown as they are
                arms = await _canary_metrics(http, stack)
                assert arms["fraction"] == 0.5
                assert arms["candidate"] + arms["target"] == 13
                assert arms["difference"] == 1.0 and "low" not in arms
        else:
            pytest.fail("the canary never decided")
        assert {untagged(model) for model in served.values()} == {TINY_NAME, AT[1]}  # at once
        assert untagged(said).startswith(f"promoted {AT[1]} to {PROD} after its canary: live 1.00")

        moves = await store.alias_moves(PROD)
        assert [(untagged(m.model), m.reason) for m in reversed(moves)] == [
            (TINY_NAME, "promote"),
            (AT[1], "canary"),
            (AT[1], "promote"),
        ]
        assert "off-policy 0.50" in (moves[1].note or "")  # the gate's evidence is kept
        record = next(a for a in await store.aliases() if a.alias == PROD)
        assert record.canary is None and untagged(record.model) == AT[1]
        looks = await store.canary_looks(PROD)  # newest first, one per change of the evidence
        assert [look.verdict for look in looks].count("promote") == 1
        assert looks[0].verdict == "promote" and looks[0].low is not None and looks[0].low > 0
        assert all(look.verdict == "hold" for look in looks[1:])
        assert looks[-1].low is None  # the first: too few an arm for an interval
        assert len(looks) == len(served)  # a look per watch: each saw one more scored
        assert "canary" not in str(await _canary_metrics(http, stack))  # ended: nothing shown


async def _canary_metrics(http: aiohttp.ClientSession, stack: Stack) -> dict[str, float]:
    """The canary's series on /metrics: its share, each arm's scored count, the difference
    and its bounds."""
    async with http.get(f"{stack.proxy.root_url}/metrics") as response:
        text = await response.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("art_proxy_canary_"):
            continue
        series, value = line.rsplit(" ", 1)
        if series.startswith("art_proxy_canary_fraction"):
            found["fraction"] = float(value)
        elif series.startswith("art_proxy_canary_scored_trajectories"):
            found["candidate" if 'arm="candidate"' in series else "target"] = float(value)
        elif series.startswith("art_proxy_canary_difference"):
            found[series.split('bound="')[1].split('"')[0]] = float(value)
    return {key.replace("estimate", "difference"): value for key, value in found.items()}


async def test_a_staged_canary_widens_keeps_its_arms_and_its_evidence_by_stage(
    shadowed: Stack, tmp_path: Path
) -> None:
    stack = shadowed
    policy = CanaryPolicy(fractions=(0.2, 0.6), alpha=0.05, min_effect=0.05, stage_trajectories=4)
    async with harness(stack, policy) as h:
        store, http, promoter, state = h.store, h.http, h.promoter, h.state
        await h.swap_candidate(stack, tmp_path / "a1")
        # Validated clearly below the target: no user sees it.
        held = untagged(await promoter.consider({AT[1]: 0.3}, state) or "")
        assert held == f"no canary for {AT[1]}: val 0.30 below 0.50 ({TINY_NAME}) by more than 0.05"
        started = untagged(await promoter.consider({AT[1]: 0.6}, state) or "")
        assert started.startswith(f"canary {AT[1]} on 20% of {PROD}'s new trajectories")
        began = next(a for a in await store.aliases() if a.alias == PROD).canary_since

        # Conversations that began at 20% and go on after the canary widens.
        ongoing = {f"ongoing-{i}": await _call(http, stack, f"ongoing-{i}") for i in range(8)}
        served: dict[str, str] = {}
        widened = None
        for index in range(200):  # equal arms: the first stage holds until it has served 4
            trajectory = f"stage-{index}"
            served[trajectory] = await _call(http, stack, trajectory)
            await _finish(http, stack, trajectory, float(index % 2))
            if (widened := await promoter.watch(state)) is not None:
                break
        assert widened is not None and untagged(widened).startswith(
            f"canary {AT[1]} widened to 60% of {PROD}'s new trajectories: live "
        )
        assert "(stage 1 of 2, 20%)" in widened
        record = next(a for a in await store.aliases() if a.alias == PROD)
        assert (record.canary_fraction, record.canary_since) == (0.6, began)  # the same draw
        # Each conversation's next call stays on the arm it began on.
        assert {t: await _call(http, stack, t) for t in ongoing} == ongoing
        # The second stage adds to the first's evidence (each compared within itself).
        before = (await store.canary_looks(PROD, limit=1))[0]
        await _call(http, stack, "stage-two")
        await _finish(http, stack, "stage-two", 1.0)
        assert await promoter.watch(state) is None
        newest = (await store.canary_looks(PROD, limit=1))[0]
        assert newest.fraction == 0.6 and "(stage 2 of 2, 60%)" in newest.note
        counted = before.candidate.count + before.target.count
        assert newest.candidate.count + newest.target.count == counted + 1 == len(served) + 1
        moves = await store.alias_moves(PROD)
        assert [(m.reason, untagged(m.model), m.fraction) for m in reversed(moves)] == [
            ("promote", TINY_NAME, None),
            ("canary", AT[1], 0.2),
            ("canary", AT[1], 0.6),
        ]


async def test_metrics_answer_without_the_canary_when_the_store_cannot_read_its_looks(
    shadowed: Stack, tmp_path: Path
) -> None:
    """A running canary whose looks the store cannot read (their table gone: the store answers
    with an error): /metrics still answers, every other series in it."""
    stack = shadowed
    async with aiohttp.ClientSession() as http:
        adapter = {"lora_name": "deployed@1", "lora_path": str(_adapter(stack.model_dir, tmp_path))}
        async with http.post(f"{stack.llm.base_url}/load_lora_adapter", json=adapter) as response:
            assert response.status == 200
        admin = f"{stack.proxy.root_url}/art/v1/aliases/{PROD}"
        async with http.put(admin, json={"model": TINY_NAME, "reason": "promote"}) as response:
            assert response.status == 200
        canary = {"model": "deployed@1", "reason": "canary", "fraction": 0.5}
        async with http.put(admin, json=canary) as response:
            assert response.status == 200, await response.text()
        path = stack.store_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as connection:
            connection.execute("DROP TABLE canary_looks")
        async with http.get(f"{stack.proxy.root_url}/metrics") as response:
            text = await response.text()
            assert response.status == 200, text
    assert "art_proxy_store_available" in text and "art_proxy_canary_reward{" not in text


async def test_a_canary_given_all_the_traffic_by_hand_is_said_once_and_never_crashes_the_trainer(
    shadowed: Stack, tmp_path: Path
) -> None:
    stack = shadowed
    policy = CanaryPolicy(fractions=(0.5,), alpha=0.05, min_effect=0.05)
    async with harness(stack, policy) as h:
        http, promoter, state = h.http, h.promoter, h.state
        await h.swap_candidate(stack, tmp_path / "a1")
        await promoter.consider({AT[1]: 0.6}, state)
        loaded = [m for m in await _models(http, stack.llm.base_url) if untagged(m) == AT[1]]
        everything = {"model": loaded[0], "reason": "canary", "fraction": 1.0}
        admin = f"{stack.proxy.root_url}/art/v1/aliases/{PROD}"
        async with http.put(admin, json=everything) as response:
            assert response.status == 200, await response.text()
        for index in range(3):
            await _call(http, stack, f"all-{index}")
            await _finish(http, stack, f"all-{index}", 1.0)
        said = await promoter.watch(state)
        assert said is not None and "serves 100% of prod-agent's new trajectories" in said
        assert await promoter.watch(state) is None  # said once


async def test_a_canary_undecided_after_its_budget_ends_with_the_target_kept(
    shadowed: Stack, tmp_path: Path
) -> None:
    stack = shadowed
    policy = CanaryPolicy((0.5,), alpha=0.05, min_effect=0.05, max_trajectories=24)
    async with harness(stack, policy) as h:
        store, http, promoter, state = h.store, h.http, h.promoter, h.state
        await h.swap_candidate(stack, tmp_path / "a1")
        await promoter.consider({AT[1]: 0.6}, state)
        said = None
        for index in range(24):  # the same rewards on both arms: never decided
            await _call(http, stack, f"even-{index}")
            await _finish(http, stack, f"even-{index}", float(index // 2 % 2))
            said = await promoter.watch(state)
            if index < 23:
                assert said is None
        assert said is not None and "undecided after 24 scored trajectories" in said
        assert untagged(said).startswith(f"canary {AT[1]} ended, no difference worth acting on")
        record = next(a for a in await store.aliases() if a.alias == PROD)
        assert (record.model, record.canary) == (TINY_NAME, None)
        assert (await store.alias_moves(PROD, limit=1))[0].reason == "kept"
