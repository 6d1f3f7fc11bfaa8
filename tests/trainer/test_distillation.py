"""On-policy distillation's per-token term: a teacher's logprob of each token the agent sampled,
minus the logprob the sampler drew it with (recorded by the proxy), added to the group advantage.

The term is checked exactly against its definition on recorded calls; the teacher's scoring of a
call is checked against a fake vLLM (whose `prompt_logprobs` are a known function of the id), and
against local-llm serving the student's own weights, where the term must vanish.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console

from art_proxy.config import TrainSettings
from art_proxy.rollout import load_agent, run_rollouts
from art_proxy.scenarios import load_scenarios
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.teacher import TeacherError
from art_proxy_trainer.advantages import token_advantages
from art_proxy_trainer.batch import TrajectorySample, build_batch
from art_proxy_trainer.command import run_train
from tests.trainer.conftest import TINY_NAME, Stack
from tests.trainer.records import call

HERE = Path(__file__).parent

PROMPT, NEXT_PROMPT = [5, 6, 7], [5, 6, 7, 20, 21, 22, 8]
SAMPLED = [-0.25, -1.5, -0.125]
TEACHER = [-0.5, -0.75, -2.0]


def test_the_teacher_term_is_the_teachers_logprob_minus_the_sampling_logprob_exactly() -> None:
    """Of each sampled token and only of those: context and a choice the teacher did not score
    carry the group advantage alone."""
    first = call(0, PROMPT, [20, 21, 22], SAMPLED)
    second = call(1, NEXT_PROMPT, [30, 31], [-0.5, -0.5])  # not scored by the teacher
    batch = build_batch(
        [TrajectorySample("t1", [first, second], 0.75)], teacher={(first.id, 0): TEACHER}
    )
    assert batch.teacher_logprobs_B_T is not None
    advantages = token_advantages(
        batch.advantages_B,
        batch.teacher_logprobs_B_T,
        batch.old_logprobs_B_T,
        teacher_weight=2.0,
    )
    [row] = advantages.tolist()
    sampled = [3, 4, 5]  # positions of the first call's completion in the stitched row
    expected_term = (
        torch.tensor(TEACHER, dtype=torch.float32) - torch.tensor(SAMPLED, dtype=torch.float32)
    ).tolist()
    assert [row[p] for p in sampled] == [0.75 + 2.0 * term for term in expected_term]
    others = [p for p in range(len(row)) if p not in sampled]
    assert all(row[p] == 0.75 for p in others)  # context and the unscored call


def test_the_teacher_alone_trains_a_row_whose_group_advantage_is_zero() -> None:
    first = call(0, PROMPT, [20, 21, 22], SAMPLED)
    batch = build_batch([TrajectorySample("t1", [first], 0.0)], teacher={(first.id, 0): TEACHER})
    assert batch.teacher_logprobs_B_T is not None
    advantages = token_advantages(
        batch.advantages_B,
        batch.teacher_logprobs_B_T,
        batch.old_logprobs_B_T,
        teacher_weight=1.0,
        group_weight=0.0,
    )
    assert advantages[0, 3:].tolist() == [
        t - s
        for t, s in zip(torch.tensor(TEACHER).tolist(), torch.tensor(SAMPLED).tolist(), strict=True)
    ]
    assert advantages[0, :3].abs().sum() == 0


def test_a_batch_no_teacher_scored_carries_no_teacher_tensor() -> None:
    first = call(0, PROMPT, [20, 21, 22], SAMPLED)
    batch = build_batch([TrajectorySample("t1", [first], 1.0)], teacher={(first.id, 0): None})
    assert batch.teacher_logprobs_B_T is None
    taken = build_batch(
        [TrajectorySample("t1", [first], 1.0)], teacher={(first.id, 0): TEACHER}
    ).take([0])
    assert taken.teacher_logprobs_B_T is not None
    assert math.isnan(taken.teacher_logprobs_B_T[0, 0].item())


def _settings(stack: Stack, out: Path, **overrides: object) -> TrainSettings:
    return TrainSettings.model_validate(
        {
            "store": stack.store_url,
            "proxy": stack.proxy.root_url,
            "upstream": [stack.llm.base_url],
            "model": str(stack.model_dir),
            "out": str(out),
            "agent": f"{HERE / 'agents.py'}:same_reward_agent",
            "scenarios": str(HERE / "scenarios.jsonl"),
            "steps": 1,
            "group_size": 4,
            "groups_per_step": 2,
            "val_every": 0,
            "keep_adapters": 2,
            **overrides,
        }
    )


async def test_the_whole_loop_distils_groups_without_reward_spread_from_a_teacher(
    stack: Stack, tmp_path: Path
) -> None:
    """Context distillation on one server: the teacher is the student's own base model shown a
    hint; every group's rewards are alike (GRPO alone would abandon the step: no_signal), and the
    step trains on the teacher's term alone."""
    hint = tmp_path / "hint.txt"
    hint.write_text("Answer in one short word.")
    settings = _settings(  # no --teacher: the base model the upstream serves, with the hint
        stack, tmp_path / "run", teacher_context=str(hint), group_advantage=False
    )
    await asyncio.wait_for(run_train(settings, Console(quiet=True)), 300)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        [step] = await store.training_steps(run="run")
    assert step.status == "applied", step.reason
    assert set(step.groups.values()) == {"trained"}
    assert step.metrics["teacher_tokens"] > 0 and step.metrics["teacher_failed_calls"] == 0
    assert math.isfinite(step.metrics["teacher_kl"])
    # Every group teaches: no round of rollouts more to look for a reward spread.
    assert step.metrics["rollout_rounds"] == 1.0
    # Without the teacher the same groups carry no signal.
    plain = _settings(stack, tmp_path / "plain")
    await asyncio.wait_for(run_train(plain, Console(quiet=True)), 300)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        [plain_step] = await store.training_steps(run="plain")
    assert (plain_step.status, plain_step.reason) == ("abandoned", "no_signal")
    assert plain_step.metrics["rollout_rounds"] > 1.0  # it looked for a spread, in vain


async def test_the_sidecar_distils_production_groups_that_carry_no_reward(
    stack: Stack, tmp_path: Path
) -> None:
    """`--reward-source teacher`: groups the proxy recorded with no judge and no reward (what
    production traffic is), taken once their members ended, every member trained on the
    teacher's term; the rewards' own source never offers them."""
    train = [s for s in load_scenarios(HERE / "scenarios.jsonl") if s.split == "train"][:2]
    report = await run_rollouts(
        load_agent(f"{HERE / 'agents.py'}:unrewarded_agent"),
        train,
        proxy_url=stack.proxy.root_url,
        group_size=4,
        concurrency=8,
        timeout_s=60,
        model=TINY_NAME,
    )
    recorded = {group.group_id for group in report.groups}
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        rewarded = await store.trainable_groups("run", source="finish")
        offered = await store.trainable_groups("run", source="teacher")
    assert rewarded == []
    assert {g.group_id for g in offered} == recorded
    assert all(len(g.unrewarded) == 4 and g.rewards == {} for g in offered)
    sidecar = _settings(
        stack,
        tmp_path / "run",
        agent=None,
        scenarios=None,
        reward_source="teacher",
        teacher=TINY_NAME,
        group_advantage=False,
        group_wait=0,
    )
    await asyncio.wait_for(run_train(sidecar, Console(quiet=True)), 300)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        [step] = await store.training_steps(run="run")
    assert step.status == "applied", step.reason
    assert step.groups == dict.fromkeys(recorded, "trained")
    assert step.metrics["teacher_tokens"] > 0 and "reward_mean" not in step.metrics
    # What the teacher said of each call, kept for the trajectory page: the worst tokens first.
    first = report.groups[0].trajectory_ids[0]
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        [said] = await store.teacher_scores(first)
        trajectory = await store.trajectory(first)
    assert trajectory is not None and trajectory.calls
    [call_] = trajectory.calls
    assert (said.call_id, said.run, said.step, said.teacher) == (call_.id, "run", 1, TINY_NAME)
    assert call_.completion_token_ids is not None
    assert said.tokens == len(call_.completion_token_ids[0])
    gaps = [d.sampled - d.teacher for d in said.disagreements]
    assert 0 < len(gaps) <= 8 and gaps == sorted(gaps, reverse=True)
    assert all(d.text for d in said.disagreements)  # decoded by the trainer's tokenizer


async def test_a_teacher_the_upstream_does_not_serve_is_refused_before_any_rollout(
    stack: Stack, tmp_path: Path
) -> None:
    settings = _settings(stack, tmp_path / "run", teacher="someone/else")
    with pytest.raises(TeacherError, match="serves no model 'someone/else'"):
        await asyncio.wait_for(run_train(settings, Console(quiet=True)), 300)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        assert await store.training_steps(run="run") == []


def test_the_teachers_flags_without_a_teacher_are_refused_in_one_line() -> None:
    with pytest.raises(
        ValueError,
        match="--teacher-base-url, --no-group-advantage needs --teacher MODEL or --teacher-context",
    ):
        TrainSettings(teacher_base_url="http://127.0.0.1:9/v1", group_advantage=False)
    with pytest.raises(ValueError, match="--reward-source teacher needs --teacher"):
        TrainSettings(reward_source="teacher")
    with pytest.raises(ValueError, match="--teacher-base-url needs --teacher MODEL: the model"):
        TrainSettings(teacher_base_url="http://127.0.0.1:9/v1", teacher_context="hint.txt")
    # A context alone: the student's own base model teaches (self-distillation).
    assert TrainSettings(teacher_context="hint.txt", group_advantage=False).distils
    with pytest.raises(ValueError, match="--teacher-context-from reads the scenarios"):
        TrainSettings(teacher_context_from="hint")
    assert TrainSettings(teacher_context_from="reference", agent="a.py:f", scenarios="s").distils
