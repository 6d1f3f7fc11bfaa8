"""vLLM's sleep mode around a step: the whole loop on one GPU frees vLLM's memory while it trains.

Against the fake vLLM, which serves vLLM's server-level sleep routes when told to (as vLLM does
with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1) and 404 otherwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from art_proxy.config import TrainerConfig, TrainSettings
from art_proxy.config.up import UpSettings
from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm
from art_proxy.up.plan import plan, trainer_command
from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.errors import SleepError
from art_proxy_trainer.sleep import UpstreamSleep
from art_proxy_trainer.step_result import StepResult
from tests.trainer.test_trainer_parts import _samples, _trainer


async def test_the_step_runs_while_vllm_sleeps_and_vllm_wakes_after(tmp_path: Path) -> None:
    async with running_fake_vllm(FakeVllmConfig(sleep_mode=True)) as vllm:
        trainer = _trainer(tmp_path)
        seen_during_step: list[list[str]] = []
        real_train = trainer.policy.train

        def train(
            batch: TrainingBatch, config: TrainerConfig, *, fresh_optimizer: bool = False
        ) -> StepResult:
            seen_during_step.append(list(vllm.sleeps))
            return real_train(batch, config, fresh_optimizer=fresh_optimizer)

        trainer.policy.train = train  # type: ignore[method-assign]  # observe the step
        async with UpstreamSleep([vllm.base_url]) as sleeper:
            await sleeper.check()
            trainer.sleeper = sleeper
            status, _ = await trainer._optimise(_samples(), {}, {"g": "trained"})
        assert status == "applied"
        assert seen_during_step == [["sleep 1"]]
        assert vllm.sleeps == ["sleep 1", "wake_up"]


async def test_vllm_wakes_even_when_the_step_fails() -> None:
    async with (
        running_fake_vllm(FakeVllmConfig(sleep_mode=True)) as vllm,
        UpstreamSleep([vllm.base_url]) as sleeper,
    ):
        with pytest.raises(RuntimeError):
            async with sleeper.asleep():
                raise RuntimeError("the step failed")
        assert vllm.sleeps == ["sleep 1", "wake_up"]


async def test_a_vllm_without_sleep_mode_is_refused_at_start_in_one_line() -> None:
    async with running_fake_vllm() as vllm, UpstreamSleep([vllm.base_url]) as sleeper:
        with pytest.raises(SleepError, match="start vLLM with --enable-sleep-mode") as error:
            await sleeper.check()
    assert "\n" not in str(error.value)


def test_only_the_whole_loop_sleeps_its_upstream(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="--sleep-upstreams is for the whole loop"):
        TrainSettings(sleep_upstreams=True)
    with pytest.raises(ValidationError, match="--sleep-mode is for --engine vllm with --agent"):
        UpSettings(sleep_mode=True, engine="vllm")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    looped = UpSettings(
        engine="vllm",
        model="/models/Qwen2.5-7B-Instruct",
        vllm_python=str(python),
        agent="agent.py:rollout",
        scenarios="s.jsonl",
        sleep_mode=True,
    )
    llm = plan(looped)[0]
    assert "--enable-sleep-mode" in llm.argv and llm.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "--sleep-upstreams" in (trainer_command(looped) or "")
