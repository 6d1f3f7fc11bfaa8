"""A production alias on a tiny model: promoted on validation evidence, rolled back on live reward.

The training alias moves every step; `--promote-alias` moves only to an adapter whose validation
reward is at least that of the one it serves, rolls back when production rates the promoted one
worse, and pins what it serves (and its rollback target) upstream whatever `--keep-adapters` says.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from peft import LoraConfig, get_peft_model
from rich.console import Console
from transformers import AutoModelForCausalLM

from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy_trainer.checkpoint import TrainerState
from art_proxy_trainer.command import run_train
from art_proxy_trainer.promoter import Promoter
from art_proxy_trainer.swap import AdapterSwapper
from tests.trainer.agents import untagged
from tests.trainer.conftest import TINY_NAME, Stack
from tests.trainer.test_training_loop import HERE, _models, _settings

PROD = "prod-agent"
AT = [f"{TINY_NAME}@{n}" for n in range(5)]  # AT[n]: the adapter of step n


@pytest.fixture
async def store(stack: Stack) -> AsyncIterator[TrajectoryStore]:
    async with TrajectoryStore.opened(stack.store_url, writer=False) as opened:
        yield opened


async def test_the_production_alias_takes_only_adapters_that_validate_at_least_as_well(
    stack: Stack, store: TrajectoryStore, tmp_path: Path
) -> None:
    # Validation (scripted by the served model): base 0.5, @1 0.7, @2 0.6, @3 0.7; it runs before
    # each step's training, so step n validates the adapter of step n-1.
    settings = _settings(
        stack,
        tmp_path / "run",
        agent=f"{HERE / 'agents.py'}:scripted_validation_agent",
        steps=4,
        val_every=1,
        keep_adapters=1,
        promote_alias=PROD,
    )
    summary = await run_train(settings, Console(quiet=True))
    assert summary.stopped == "reached --steps 4"

    moves = await store.alias_moves(PROD)
    assert [
        (untagged(m.model), m.previous and untagged(m.previous), m.reason, untagged(m.note or ""))
        for m in reversed(moves)
    ] == [
        (TINY_NAME, None, "promote", "the base model, before any adapter"),
        (AT[1], TINY_NAME, "promote", f"val 0.70 >= 0.50 ({TINY_NAME})"),
        (AT[3], AT[1], "promote", f"val 0.70 >= 0.70 ({AT[1]})"),
    ]
    steps = await store.training_steps(run="run")
    assert [s.promotion and untagged(s.promotion) for s in steps] == [
        None,  # validated the base, which production serves already
        f"promoted {AT[1]} to {PROD}: val 0.70 >= 0.50 ({TINY_NAME})",
        f"kept {AT[1]} over {AT[2]}: val 0.60 < 0.70 ({AT[1]})",
        f"promoted {AT[3]} to {PROD}: val 0.70 >= 0.70 ({AT[1]})",
    ]
    # --keep-adapters 1, yet what production serves (@3) and its rollback target (@1) stay.
    async with aiohttp.ClientSession() as http:
        loaded = await _models(http, stack.llm.base_url)
    assert [untagged(m) for m in loaded] == [TINY_NAME, AT[1], AT[3], AT[4]]
    aliases = {a.alias: untagged(a.model) for a in await store.aliases()}
    assert aliases == {PROD: AT[3], TINY_NAME: AT[4]}
    # A new run under the same training alias names its adapters apart: production's @3 stays.
    await run_train(_settings(stack, tmp_path / "new", steps=1), Console(quiet=True))
    async with aiohttp.ClientSession() as http:
        now = await _models(http, stack.llm.base_url)
    assert set(loaded) < set(now) and [untagged(m) for m in now if m not in loaded] == [AT[1]]
    assert {a.alias: a.model for a in await store.aliases()}[PROD] == loaded[2]


def swapper_for(stack: Stack) -> AdapterSwapper:
    """A swapper of the stack's adapters under the training alias, keeping one."""
    return AdapterSwapper(
        upstreams=[stack.llm.base_url],
        upstream_api_key=None,
        proxy=stack.proxy.root_url,
        admin_key=None,
        alias=TINY_NAME,
        keep=1,
    )


def _adapter(model_dir: Path, out: Path) -> Path:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    get_peft_model(model, LoraConfig(r=2, target_modules="all-linear")).save_pretrained(str(out))
    return out


async def _prod_traffic(
    http: aiohttp.ClientSession, stack: Stack, name: str, rewards: list[float]
) -> None:
    """Production agents calling the production alias; each conversation rated once it ends
    (the first by the user's feedback, the others by the agent's own reward)."""
    for index, reward in enumerate(rewards):
        trajectory = f"{name}-{index}"
        headers = {"X-Art-Trajectory": trajectory, "X-Art-Split": "prod"}
        body = {"model": PROD, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with http.post(
            f"{stack.proxy.base_url}/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status == 200, await response.text()
        admin = f"{stack.proxy.root_url}/art/v1"
        finish = {} if index == 0 else {"reward": reward}
        async with http.post(f"{admin}/trajectories/{trajectory}/finish", json=finish) as response:
            assert response.status == 200, await response.text()
        if index == 0:
            feedback = {"trajectory_id": trajectory, "score": reward, "as_reward": True}
            async with http.post(f"{admin}/feedback", json=feedback) as response:
                assert response.status == 200, await response.text()


async def test_a_promoted_adapter_that_production_rates_worse_is_rolled_back(
    stack: Stack, store: TrajectoryStore, tmp_path: Path
) -> None:
    state = TrainerState(run="run", validated={TINY_NAME: 0.5})
    async with (
        aiohttp.ClientSession() as http,
        swapper_for(stack) as swapper,
    ):
        await swapper.check_base_model({TINY_NAME})
        promoter = Promoter(PROD, store, swapper, min_trajectories=4, margin=0.05)
        await promoter.start()
        await _prod_traffic(http, stack, "base", [0.9, 0.8, 0.9, 0.8])
        assert (await swapper.swap(1, _adapter(stack.model_dir, tmp_path / "a1"))).status == (
            "swapped"
        )
        promoted = await promoter.consider({AT[1]: 0.6}, state)
        assert promoted == f"promoted {AT[1]} to {PROD}: val 0.60 >= 0.50 ({TINY_NAME})"

        await _prod_traffic(http, stack, "first", [0.5, 0.4, 0.4])
        assert await promoter.watch(state) is None  # 3 of 4 scored trajectories: too few
        await _prod_traffic(http, stack, "more", [0.5])
        rolled_back = await promoter.watch(state)
        assert await promoter.watch(state) is None  # rolled back already

        # The rolled-back adapter is not promoted again in this run, whatever it scores.
        again = await promoter.consider({AT[1]: 0.99}, state)

    note = f"live 0.45 (n=4, {AT[1]}) vs 0.85 (n=4, {TINY_NAME}), margin 0.05"
    assert rolled_back == f"{PROD} rolled back from {AT[1]} to {TINY_NAME}: {note}"
    latest = (await store.alias_moves(PROD, limit=1))[0]
    assert (latest.model, latest.previous, latest.reason, latest.note) == (
        TINY_NAME,
        AT[1],
        "rollback",
        note,
    )
    assert state.rolled_back == [AT[1]]
    assert again == f"kept {TINY_NAME} over {AT[1]}: rolled back earlier in this run"
    assert {a.alias: a.model for a in await store.aliases()}[PROD] == TINY_NAME


async def test_the_sidecar_rolls_back_while_it_waits_for_groups(
    stack: Stack, store: TrajectoryStore, tmp_path: Path
) -> None:
    admin = f"{stack.proxy.root_url}/art/v1"
    async with aiohttp.ClientSession() as http:
        # Production was promoted from the base to an adapter deployed earlier, then rated worse.
        adapter = {"lora_name": "deployed@1", "lora_path": str(_adapter(stack.model_dir, tmp_path))}
        async with http.post(f"{stack.llm.base_url}/load_lora_adapter", json=adapter) as response:
            assert response.status == 200
        for model in (TINY_NAME, "deployed@1"):
            move = {"model": model, "reason": "promote"}
            async with http.put(f"{admin}/aliases/{PROD}", json=move) as response:
                assert response.status == 200
            await _prod_traffic(
                http, stack, model, [0.9, 0.8] if model == TINY_NAME else [0.1, 0.2]
            )
        settings = _settings(
            stack,
            tmp_path / "run",
            agent=None,
            scenarios=None,
            promote_alias=PROD,
            rollback_min_trajectories=2,
            poll=0.05,
        )
        training = asyncio.create_task(run_train(settings, Console(quiet=True)))
        try:
            deadline = time.monotonic() + 60
            while {a.alias: a.model for a in await store.aliases()}.get(PROD) != TINY_NAME:
                assert time.monotonic() < deadline, "the waiting sidecar never rolled back"
                assert not training.done(), training
                await asyncio.sleep(0.05)
        finally:
            training.cancel()
            await asyncio.gather(training, return_exceptions=True)

    latest = (await store.alias_moves(PROD, limit=1))[0]
    assert (latest.previous, latest.reason) == ("deployed@1", "rollback")
    assert await store.training_steps(run="run") == []  # no group to train on: it only waited
