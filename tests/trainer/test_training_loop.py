"""The whole loop on a tiny model: rollouts through the proxy, training, hot-swap under load."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from openai.types.chat import ChatCompletion
from rich.console import Console

from art_proxy.config import TrainSettings
from art_proxy.errors import ConfigError
from art_proxy.records import JudgeCheckRecord
from art_proxy.rollout import load_agent, run_rollouts
from art_proxy.scenarios import Scenario, load_scenarios
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm
from art_proxy_trainer import policy as policy_module
from art_proxy_trainer.command import run_train
from art_proxy_trainer.errors import BaseModelMismatch, CheckpointError, RolloutsFailed
from art_proxy_trainer.ledger import SampledGroups
from art_proxy_trainer.step_result import StepResult
from tests.ruler.scripted_judge import running_scripted_judge
from tests.test_training_store import judgment
from tests.trainer.agents import length_reward, untagged
from tests.trainer.conftest import TINY_NAME, Stack
from tests.trainer.under_load import train_under_load

HERE = Path(__file__).parent
AGENT = f"{HERE / 'agents.py'}:length_agent"
SCENARIOS = str(HERE / "scenarios.jsonl")


def _settings(stack: Stack, out: Path, **overrides: object) -> TrainSettings:
    return TrainSettings.model_validate(
        {
            "store": stack.store_url,
            "proxy": stack.proxy.root_url,
            "upstream": [stack.llm.base_url],
            "model": str(stack.model_dir),
            "out": str(out),
            "agent": AGENT,
            "scenarios": SCENARIOS,
            "steps": 3,
            "group_size": 4,
            "groups_per_step": 2,
            "val_every": 2,
            "keep_adapters": 2,
            "learning_rate": 1e-2,
            **overrides,
        }
    )


async def _leased(http: aiohttp.ClientSession, proxy_root: str) -> set[str]:
    """The models open trajectories hold (`GET /art/v1/leases`), run tags left out."""
    async with http.get(f"{proxy_root}/art/v1/leases") as response:
        return {untagged(lease["model"]) for lease in (await response.json())["data"]}


async def _models(http: aiohttp.ClientSession, base_url: str) -> list[str]:
    async with http.get(f"{base_url}/models") as response:
        return [entry["id"] for entry in (await response.json())["data"]]


async def test_the_whole_loop_swaps_each_step_in_with_no_failed_call_under_load(
    stack: Stack, tmp_path: Path
) -> None:
    run = await train_under_load(
        _settings(stack, tmp_path / "run"),
        proxy_base_url=stack.proxy.base_url,
        model=TINY_NAME,
        last=f"{TINY_NAME}@3",
    )
    summary, served, failures = run.summary, run.served, run.failures
    async with aiohttp.ClientSession() as http:
        upstream_models = await _models(http, stack.llm.base_url)
        held = await _leased(http, stack.proxy.root_url)

    assert summary.stopped == "reached --steps 3"
    assert failures == []
    # The load saw the base model, then adapters, as the alias moved under it.
    assert served[0] == TINY_NAME and f"{TINY_NAME}@3" in served
    assert served.index(f"{TINY_NAME}@1") < served.index(f"{TINY_NAME}@3")
    # Only the last --keep-adapters adapters stay loaded upstream, and an older one an open
    # trajectory of the load still holds (its lease), until that trajectory finishes.
    kept = [f"{TINY_NAME}@{n}" for n in (1, 2, 3) if n >= 2 or f"{TINY_NAME}@{n}" in held]
    assert [untagged(m) for m in upstream_models] == [TINY_NAME, *kept]

    store = await TrajectoryStore.open(stack.store_url, writer=False)
    try:
        steps = await store.training_steps(run="run")
        aliases = await store.aliases()
        moves = await store.alias_moves(TINY_NAME)
    finally:
        await store.aclose()
    assert [(s.step, s.status, s.swap) for s in steps] == [
        (1, "applied", "swapped"),
        (2, "applied", "swapped"),
        (3, "applied", "swapped"),
    ]
    assert [(a.alias, untagged(a.model), a.step) for a in aliases] == [
        (TINY_NAME, f"{TINY_NAME}@3", 3)
    ]
    assert [untagged(m.model) for m in reversed(moves)] == [f"{TINY_NAME}@{n}" for n in (1, 2, 3)]
    # Each step trained on two fresh groups of this run's rollouts; step 2 validated.
    for step in steps:
        assert sum(o == "trained" for o in step.groups.values()) >= 1
        assert {"loss", "grad_norm", "reward_mean", "tokens", "seconds_train"} <= set(step.metrics)
    assert "val_reward" in steps[1].metrics
    assert "validation" in steps[1].groups.values()
    consumed = [g for s in steps for g in s.groups]
    assert len(consumed) == len(set(consumed))
    metrics_lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics_lines) == 3


async def test_an_upstream_that_rejects_the_adapter_leaves_the_alias_where_it_was(
    stack: Stack, tmp_path: Path
) -> None:
    # A second replica of the same base model whose runtime LoRA is off: it answers 404.
    config = FakeVllmConfig(model=TINY_NAME, allow_runtime_lora=False)
    async with running_fake_vllm(config) as refusing:
        settings = _settings(
            stack,
            tmp_path / "run",
            upstream=[stack.llm.base_url, refusing.base_url],
            steps=1,
            val_every=0,
        )
        await run_train(settings, Console(quiet=True))
    async with aiohttp.ClientSession() as http:
        upstream_models = await _models(http, stack.llm.base_url)

    store = await TrajectoryStore.open(stack.store_url, writer=False)
    try:
        (step,) = await store.training_steps(run="run")
        aliases = await store.aliases()
    finally:
        await store.aclose()
    assert step.status == "applied" and step.swap == "rejected"
    assert step.swap_error is not None and "404" in step.swap_error
    assert aliases == []
    # The replica that took the adapter gave it back.
    assert upstream_models == [TINY_NAME]


async def test_a_trainer_for_another_base_model_is_refused_before_training(
    stack: Stack, tmp_path: Path
) -> None:
    async with running_fake_vllm(FakeVllmConfig()) as other:
        settings = _settings(stack, tmp_path / "run", upstream=[other.base_url])
        with pytest.raises(BaseModelMismatch, match=re.escape("Qwen/Qwen2.5-0.5B-Instruct")):
            await run_train(settings, Console(quiet=True))


def train_command(stack: Stack, out: Path, steps: int) -> list[str]:
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    return [
        art_proxy,
        "train",
        *("--store", stack.store_url, "--proxy", stack.proxy.root_url),
        *("--upstream", stack.llm.base_url, "--model", str(stack.model_dir)),
        *("--out", str(out), "--steps", str(steps), "--reward-source", "finish"),
        *("--group-size", "4"),  # the rollouts' groups: each is ready once all four finished
        *("--groups-per-step", "2", "--val-every", "0", "--poll", "0.2", "--keep-adapters", "2"),
        # The groups were all sampled by the base model before training started.
        *("--max-staleness", "10"),
    ]


async def finished_groups(stack: Stack, *, scenarios: int, rounds: int) -> set[str]:
    """Groups of 4 rollouts, one per scenario a round, rewarded at finish; their ids."""
    asked = [Scenario(id=f"s{n}", input=f"Question {n}?") for n in range(scenarios)]
    groups: set[str] = set()
    for _ in range(rounds):
        groups |= await rollout_groups(stack, asked)
    return groups


async def rollout_groups(
    stack: Stack, scenarios: list[Scenario], model: str = TINY_NAME, ledger: Path | None = None
) -> set[str]:
    """A group of 4 rollouts of the agent on each of `scenarios`, served through `model` (the
    alias) and rewarded at finish; their ids. `ledger`: the --out of the run they are written
    to as sampled, as its loop writes a batch before it judges or trains it."""
    report = await run_rollouts(
        load_agent(AGENT),
        scenarios,
        proxy_url=stack.proxy.root_url,
        group_size=4,
        concurrency=8,
        timeout_s=60,
        model=model,
    )
    if ledger is not None:
        SampledGroups(ledger).add(report.groups)
    return {group.group_id for group in report.groups}


def test_the_test_agents_reward_spreads_a_group_whose_replies_are_alike() -> None:
    """Four replies of one length, as the random model sometimes writes: a group with no spread
    is skipped by the trainer, and the tests here count groups."""
    reply = ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": TINY_NAME,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length",
                    "message": {"role": "assistant", "content": "abc"},
                }
            ],
        }
    )
    rewards = [length_reward(reply, index) for index in range(4)]
    assert len(set(rewards)) > 1 and all(0.0 <= reward <= 1.0 for reward in rewards)


async def _kill_when(process: asyncio.subprocess.Process, ready: Callable[[], bool]) -> None:
    """SIGKILL the trainer the moment `ready()` holds (or when it ends by itself); a trainer that
    neither gets there nor ends within 300 s fails the test rather than hang the suite."""
    try:
        async with asyncio.timeout(300):
            while True:
                if process.returncode is not None or ready():
                    break
                await asyncio.sleep(0.01)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_a_trainer_killed_at_any_moment_resumes_without_losing_or_repeating_a_group(
    stack: Stack, tmp_path: Path
) -> None:
    groups = await finished_groups(stack, scenarios=6, rounds=2)  # 12: 6 steps of 2 groups
    out = tmp_path / "run"
    checkpoints = out / "checkpoints"
    metrics = out / "metrics.jsonl"
    kill_points: list[Callable[[], bool]] = [
        # mid-write of the second checkpoint, before the store has the step
        lambda: (checkpoints / "step-000002.partial").exists(),
        # right after the fourth checkpoint is complete (store record and swap pending)
        lambda: (checkpoints / "step-000004").exists(),
    ]
    command = train_command(stack, out, steps=6)
    statuses: list[int | None] = []
    for ready in [*kill_points, lambda: False]:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        await _kill_when(process, ready)
        statuses.append(process.returncode)
    assert statuses[:2] == [-signal.SIGKILL, -signal.SIGKILL]
    assert process.returncode == 0, (await process.stderr.read()).decode()  # type: ignore[union-attr]  # PIPE given

    store = await TrajectoryStore.open(stack.store_url, writer=False)
    try:
        steps = await store.training_steps(run="run")
        aliases = await store.aliases()
    finally:
        await store.aclose()
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
    assert all(s.status == "applied" and s.swap == "swapped" for s in steps)
    consumed = [group for step in steps for group in step.groups]
    assert sorted(consumed) == sorted(groups)  # every group once: none lost, none repeated
    assert [(untagged(a.model), a.step) for a in aliases] == [(f"{TINY_NAME}@6", 6)]
    lines = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert sorted(set(lines)) == [1, 2, 3, 4, 5, 6]


async def test_a_judge_that_cannot_answer_stops_training_before_anything_moves(
    stack: Stack, tmp_path: Path
) -> None:
    nowhere = "http://127.0.0.1:9/v1"
    settings = _settings(stack, tmp_path / "run", judge=["openai/j"], judge_base_url=nowhere)
    with pytest.raises(ConfigError, match=f"judge base URL {nowhere} does not answer"):
        await run_train(settings, Console(quiet=True))
    assert not (tmp_path / "run" / "checkpoints").exists()


async def test_a_step_whose_every_rollout_fails_with_one_error_stops_the_run_with_it(
    stack: Stack, tmp_path: Path
) -> None:
    """Twelve steps of `abandoned: no_signal`, every rollout a 404, exit 0 and "reached --steps
    12": the error sat in each trajectory's metadata and nowhere a user reads."""
    agent = f"{HERE / 'agents.py'}:misnamed_model_agent"
    settings = _settings(stack, tmp_path / "run", agent=agent, steps=3, val_every=0)
    with pytest.raises(RolloutsFailed, match=r"every rollout of step 1 failed \(8 of 8\)") as no:
        await run_train(settings, Console(quiet=True))
    assert "404" in str(no.value) and "no-such-model" in str(no.value)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        assert await store.training_steps(run="run") == []


async def test_without_a_terminal_the_loop_says_what_it_does_before_its_first_step_line(
    stack: Stack, tmp_path: Path
) -> None:
    """Piped (as `up` relays it), the whole loop printed nothing for 4 min 30 s before its first
    step line: the live status line shows only on a terminal."""
    settings = _settings(stack, tmp_path / "run", steps=1, val_every=1)
    console = Console(record=True, width=200)  # not a terminal
    await run_train(settings, console)
    said = console.export_text().splitlines()
    first_step = next(i for i, line in enumerate(said) if re.match(r"\s+1\s", line))
    before = "\n".join(said[:first_step])
    assert "validation reward of the base model" in before
    assert "step 1: rollouts, round 1" in before and "training step 1" in before
    assert "step 1: rollouts, round 1: 8/8" in before  # the rollouts counted


async def test_a_step_whose_rollouts_all_fail_each_its_own_way_says_the_first_and_the_count(
    stack: Stack, tmp_path: Path
) -> None:
    agent = f"{HERE / 'agents.py'}:flaky_agent"
    settings = _settings(stack, tmp_path / "run", agent=agent, steps=1, val_every=0)
    console = Console(record=True, width=200)
    await run_train(settings, console)
    said = console.export_text()
    assert "step 1: all 8 rollouts failed, the first: RuntimeError: the tool of rollout" in said


async def test_a_judge_that_scores_at_random_is_stopped_before_the_first_step(
    stack: Stack, tmp_path: Path
) -> None:
    """The judge check (ruler/check.py) on the first step's groups: a random judge's orders
    disagree, so the run stops in one line before it trains or swaps anything; with
    --no-judge-check it trains on it anyway."""
    from tests.ruler.test_judge_check import at_random

    async with running_scripted_judge(at_random(3)) as judge:  # type: ignore[arg-type]
        judged = {"judge": ["openai/j"], "judge_base_url": [judge.base_url], "val_every": 0}
        settings = _settings(stack, tmp_path / "run", steps=1, **judged)
        with pytest.raises(ConfigError, match=r"judge check on \d+ groups: .* below 0.3"):
            await run_train(settings, Console(quiet=True))
        assert not (tmp_path / "run" / "checkpoints").exists()
        anyway = _settings(stack, tmp_path / "anyway", steps=1, judge_check=False, **judged)
        summary = await run_train(anyway, Console(quiet=True))
    assert summary.stopped == "reached --steps 1"


async def test_a_resumed_run_serves_its_adapter_again_and_a_new_run_starts_from_the_base(
    stack: Stack, tmp_path: Path
) -> None:
    await run_train(_settings(stack, tmp_path / "first", steps=1, val_every=0), Console(quiet=True))
    async with aiohttp.ClientSession() as http:
        (first_1,) = [m for m in await _models(http, stack.llm.base_url) if m != TINY_NAME]
        assert untagged(first_1) == f"{TINY_NAME}@1" != first_1  # named with the run's tag
        # The upstream restarts and forgets its adapters; the alias still names @1.
        async with http.post(
            f"{stack.llm.base_url}/unload_lora_adapter", json={"lora_name": first_1}
        ) as response:
            assert response.status == 200
        console = Console(record=True, width=300)
        resumed = await run_train(
            _settings(stack, tmp_path / "first", steps=2, val_every=0), console
        )
        assert resumed.stopped == "reached --steps 2"
        # Moved back with a line that says so (it once moved without a word).
        said = console.export_text()
        assert f"alias '{TINY_NAME}' serves this run's newest adapter again: {first_1}" in said
        first = [m for m in await _models(http, stack.llm.base_url) if m != TINY_NAME]
        assert first[0] == first_1 and [untagged(m) for m in first] == [
            f"{TINY_NAME}@1",
            f"{TINY_NAME}@2",
        ]
        # A new run (another --out) owns the alias from the base model up, under names of its
        # own: the first run's adapters stay (another proxy sharing the upstream may serve them).
        fresh = await run_train(
            _settings(stack, tmp_path / "second", steps=1, val_every=0), Console(quiet=True)
        )
        assert fresh.stopped == "reached --steps 1"
        (second_1,) = [
            m for m in await _models(http, stack.llm.base_url) if m not in [TINY_NAME, *first]
        ]
        assert untagged(second_1) == f"{TINY_NAME}@1" != first_1

    store = await TrajectoryStore.open(stack.store_url, writer=False)
    try:
        first_steps = await store.training_steps(run="first")
        second_steps = await store.training_steps(run="second")
        moves = [m.model for m in reversed(await store.alias_moves(TINY_NAME))]
    finally:
        await store.aclose()
    assert [(s.step, s.swap) for s in first_steps] == [(1, "swapped"), (2, "swapped")]
    assert [(s.step, s.swap, s.adapter) for s in second_steps] == [(1, "swapped", second_1)]
    assert moves[-2:] == [TINY_NAME, second_1]


async def test_an_abandoned_step_labels_its_groups_abandoned_not_trained(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def nan_step(*_args: object, **_kwargs: object) -> StepResult:
        return StepResult(False, "nan_loss", math.nan, math.nan, None)

    monkeypatch.setattr(policy_module, "train_step", nan_step)
    settings = _settings(stack, tmp_path / "run", steps=1, val_every=0)
    await asyncio.wait_for(run_train(settings, Console(quiet=True)), 300)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        [step] = await store.training_steps(run="run")
    assert (step.status, step.reason) == ("abandoned", "nan_loss")
    assert "abandoned" in step.groups.values() and "trained" not in step.groups.values()


async def test_the_sidecar_refuses_the_scores_of_a_judge_whose_check_failed(
    stack: Stack, tmp_path: Path
) -> None:
    """The README's `judge --check` exited 1 ("below 0.3 ... try a stronger judge") and its next
    line trained on those scores without a word. Never checked: said once, trained on."""
    train = [s for s in load_scenarios(SCENARIOS) if s.split == "train"][:2]
    groups = await rollout_groups(stack, train)
    async with TrajectoryStore.opened(stack.store_url) as store:
        for group_id in groups:
            members = [t.id for t in await store.trajectories(group=group_id)]
            rewards = dict(zip(members, [0.0, 0.25, 0.5, 1.0], strict=True))
            await store.add_judgment(judgment(group_id, rewards))
    sidecar = {"agent": None, "scenarios": None, "steps": 1, "val_every": 0}
    console = Console(record=True, width=300)
    unchecked = await run_train(_settings(stack, tmp_path / "a", **sidecar), console)
    assert unchecked.stopped == "reached --steps 1"
    assert "judge judge's scores were never checked" in console.export_text()
    async with TrajectoryStore.opened(stack.store_url) as store:
        await store.record_judge_check(
            JudgeCheckRecord(
                judge_model="judge", rubric_hash="r", passed=False, failed=True,
                consistency=0.17, agreement=None, threshold=0.3, groups=4,
                line="judge check on 4 groups: its orders agree at Kendall tau +0.17, below 0.3",
                created_at=utcnow(),
            )
        )  # fmt: skip
    with pytest.raises(ConfigError, match=r"judge judge's scores failed their check \(judge chec"):
        await run_train(_settings(stack, tmp_path / "b", **sidecar), Console(quiet=True))
    anyway = _settings(stack, tmp_path / "c", **sidecar, judge_check=False)
    console = Console(record=True, width=300)
    assert (await run_train(anyway, console)).stopped == "reached --steps 1"
    said = console.export_text()
    assert "although they failed their check (--no-judge-check)" in said
    # A run trains each group once; another run trains them again, and says whose they were.
    assert "step 1: 2 of its 2 groups were trained before by run a" in said


async def test_a_trainer_refuses_to_resume_another_agents_run_without_resume(
    stack: Stack, tmp_path: Path
) -> None:
    """`make demo` leaves its run in art-train; `train` there for another agent's groups once
    went on with the demo's run (0 steps, the alias moved back to the demo's adapter)."""
    out = tmp_path / "art-train"
    await run_train(_settings(stack, out, steps=1, val_every=0), Console(quiet=True))
    sidecar = _settings(stack, out, steps=2, val_every=0, agent=None, scenarios=None)
    with pytest.raises(CheckpointError) as refused:
        await run_train(sidecar, Console(quiet=True))
    message = str(refused.value)
    assert "holds step 1 of another run" in message and "(now None)" in message
    assert "--out NEW_DIR" in message and "--resume" in message
    # Told to: it goes on with that run (which has its one step already).
    told = _settings(stack, out, steps=1, val_every=0, agent=None, scenarios=None, resume=True)
    resumed = await asyncio.wait_for(run_train(told, Console(quiet=True)), 120)
    assert resumed.stopped == "reached --steps 1"


async def _one_guided_step(stack: Stack, tmp_path: Path, agent: str) -> None:
    """One step of the whole loop with guided retries, the agent one of agents.py's."""
    settings = _settings(
        stack,
        tmp_path / "run",
        steps=1,
        val_every=0,
        agent=f"{HERE / 'agents.py'}:{agent}",
        guided_retries=True,
        guide="Answer in one word.",
    )
    summary = await asyncio.wait_for(run_train(settings, Console(quiet=True)), 300)
    assert summary.stopped == "reached --steps 1"


async def test_groups_that_all_failed_are_run_again_guided_and_trained_without_the_guidance(
    stack: Stack, tmp_path: Path
) -> None:
    await _one_guided_step(stack, tmp_path, "fails_unless_guided")
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        (step,) = await store.training_steps(run="run")
        trained = [g for g, outcome in step.groups.items() if outcome == "trained"]
        guided = [
            call
            for group in trained
            for t in await store.trajectories(group=group)
            for call in (await store.calls([t.id]))[t.id]
        ]
    # Round 1's two groups all failed; each ran again guided, and each retry trained pooled
    # with the group it retried.
    assert (step.metrics["guided_retries"], step.metrics["guided_rescued"]) == (2.0, 2.0)
    assert step.metrics["rollout_rounds"] == 1.0
    assert len(trained) == 4
    hinted = [call for call in guided if call.guidance is not None]
    assert len(hinted) == len(guided) // 2 == 8
    for call in hinted:
        assert call.trainable
        assert call.guidance is not None and call.guidance.text == "Answer in one word."
        assert "Answer in one word." not in str(call.request["messages"])


async def test_a_retry_the_guidance_rescued_entirely_trains_against_the_failures(
    stack: Stack, tmp_path: Path
) -> None:
    """As a group of its own, a retry whose every rollout succeeded has no spread: its baseline
    is the unguided policy's, whose rollouts all failed."""
    await _one_guided_step(stack, tmp_path, "rescued_when_guided")
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        (step,) = await store.training_steps(run="run")
    assert step.status == "applied" and step.metrics["rollout_rounds"] == 1.0
    assert (step.metrics["guided_retries"], step.metrics["guided_rescued"]) == (2.0, 2.0)
    assert list(step.groups.values()) == ["trained"] * 4
    assert step.metrics["tokens"] > 0


async def test_overlapped_the_next_steps_rollouts_run_while_a_step_trains_within_k(
    stack: Stack, tmp_path: Path
) -> None:
    """--max-off-policy-steps 1: step n+1's rollouts are sampled while step n trains, by an
    adapter at most one change of the weights behind; every step's groups are its own."""
    settings = _settings(stack, tmp_path / "run", max_off_policy_steps=1, val_every=0)
    summary = await asyncio.wait_for(run_train(settings, Console(quiet=True)), 600)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        steps = await store.training_steps(run="run")
        began = {}  # when each step's first trained rollout began
        for step in steps:
            trained = [g for g, outcome in step.groups.items() if outcome == "trained"]
            began[step.step] = min(
                [t.created_at for g in trained for t in await store.trajectories(group=g)]
            )
    assert summary.stopped == "reached --steps 3"
    assert [(s.step, s.status, s.swap) for s in steps] == [
        (n, "applied", "swapped") for n in (1, 2, 3)
    ]
    # Step 2's batch began before step 1 was taken. Its calls' times cannot show it, nor can
    # its staleness: a tiny model's step may end before the batch's first call reaches the proxy.
    assert steps[1].metrics["pipeline_steps_ahead"] == 1
    assert began[2] < steps[1].created_at
    for step in steps:
        assert step.metrics["pipeline_steps_ahead"] <= 1 and step.metrics["staleness_max"] <= 1
    consumed = [g for s in steps for g in s.groups]
    assert len(consumed) == len(set(consumed))


async def test_overlapped_validation_runs_beside_the_batches_and_holds_up_no_step(
    stack: Stack, tmp_path: Path
) -> None:
    """A validation due at step n starts once step n - 1 is taken, on its adapter (the weights
    step n starts from, as the alternating loop validates them; named, so a swap meanwhile
    moves none of its rollouts), runs beside the batches and is recorded with a step taken
    after it ended, against those weights. Step n trains without waiting for it (it waited: 85
    of the 137 s a 12-step run's trainer waited). The last step records what is still running."""
    settings = _settings(
        stack,
        tmp_path / "run",
        max_off_policy_steps=1,
        steps=4,
        val_every=2,
        agent=f"{HERE / 'agents.py'}:slow_validation_agent",
    )
    summary = await asyncio.wait_for(run_train(settings, Console(quiet=True)), 600)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        steps = await store.training_steps(run="run")
        validated = {}  # validation group -> the models that served its calls
        for step in steps:
            for group, outcome in step.groups.items():
                if outcome == "validation":
                    members = await store.trajectories(group=group)
                    calls = await store.calls([t.id for t in members])
                    validated[group] = {
                        untagged(c.model or "") for t in members for c in calls[t.id]
                    }
    assert summary.stopped == "reached --steps 4"
    assert [s.status for s in steps] == ["applied"] * 4
    # Due at step 2 (on step 1's adapter), it ran past step 2.
    assert "val_reward" not in steps[1].metrics
    assert "validation" not in steps[1].groups.values()
    # Step 4's (on step 3's adapter) was still running when the last step trained.
    assert steps[3].metrics["val_of_step"] == 3
    assert steps[3].metrics["pipeline_validation_wait_s"] > 0
    # Each validation's rollouts all on the one model it named: step 1's adapter for step 2,
    # step 3's for step 4.
    assert all(len(models) == 1 for models in validated.values())
    assert sorted(min(models) for models in validated.values()) == [
        f"{TINY_NAME}@1",
        f"{TINY_NAME}@3",
    ]


def test_overlap_is_refused_with_ppo_past_the_staleness_bound_or_too_few_adapters_kept(
    tmp_path: Path,
) -> None:
    base = {"store": "sqlite:///x.db", "agent": AGENT, "scenarios": SCENARIOS}
    for extra, message in (
        ({"objective": "ppo"}, "needs --objective tis or mis"),
        ({"max_staleness": 1, "max_off_policy_steps": 2}, "past --max-staleness 1"),
        # A rollout K swaps behind runs on an adapter K swaps old: K + 1 must stay loaded.
        ({"keep_adapters": 2}, "--keep-adapters 2 is at or below --max-off-policy-steps 2"),
    ):
        with pytest.raises(ValueError, match=message):
            TrainSettings.model_validate({**base, "max_off_policy_steps": 2, **extra})


@pytest.mark.parametrize("overlap", [0, 1])
async def test_a_resumed_run_trains_first_on_every_group_it_sampled_and_never_trained(
    stack: Stack, tmp_path: Path, overlap: int
) -> None:
    """A killed loop leaves groups it sampled and never trained; the resumed run takes every
    one of them first, found by its ledger (ledger.py), the base model's too (the store's 100
    oldest unconsumed groups, filtered by adapter name, lost them), and no group twice."""
    out = tmp_path / "run"
    first = _settings(stack, out, steps=2, val_every=0, max_off_policy_steps=overlap)
    await asyncio.wait_for(run_train(first, Console(quiet=True)), 600)
    # What a killed run had sampled ahead: a batch by its newest adapter, and one by the base
    # model (the first batch of a run, or one after steps without signal), never trained.
    train = [s for s in load_scenarios(SCENARIOS) if s.split == "train"][:2]
    sampled = await rollout_groups(stack, train[:1], ledger=out)
    sampled |= await rollout_groups(stack, train[1:], f"{TINY_NAME}@0", ledger=out)
    # Unconsumed groups of another run on the same store are not this run's to take.
    others = await rollout_groups(stack, train[:1])
    resumed = _settings(stack, out, steps=3, val_every=0, max_off_policy_steps=overlap)
    await asyncio.wait_for(run_train(resumed, Console(quiet=True)), 600)
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        steps = await store.training_steps(run="run")
    assert [s.step for s in steps] == [1, 2, 3]
    assert set(steps[2].groups) == sampled  # the step after the restart took them
    assert steps[2].metrics["resumed_groups"] == 2.0
    consumed = [g for s in steps for g in s.groups]
    assert len(consumed) == len(set(consumed))
    assert not others & set(consumed)


async def test_a_resumed_run_judges_and_trains_the_groups_it_sampled_and_never_judged(
    stack: Stack, tmp_path: Path
) -> None:
    """With a judge, a kill between a batch's rollouts and its judgment leaves groups with no
    judgment, which no store query for judged groups finds: the resumed run judges them first."""
    from tests.ruler.test_judge_check import at_random

    out = tmp_path / "run"
    async with running_scripted_judge(at_random(3)) as judge:  # type: ignore[arg-type]
        judged = {
            "judge": ["openai/j"],
            "judge_base_url": [judge.base_url],
            "judge_check": False,
            "val_every": 0,
            "max_off_policy_steps": 1,
        }
        await asyncio.wait_for(
            run_train(_settings(stack, out, steps=1, **judged), Console(quiet=True)), 600
        )
        train = [s for s in load_scenarios(SCENARIOS) if s.split == "train"][:2]
        # Sampled, and the run killed before the judge saw them.
        sampled = await rollout_groups(stack, train, ledger=out)
        await asyncio.wait_for(
            run_train(_settings(stack, out, steps=2, **judged), Console(quiet=True)), 600
        )
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        steps = await store.training_steps(run="run")
        judgments = {j.group_id for j in await store.judgments(limit=100)}
    assert [s.step for s in steps] == [1, 2]
    assert set(steps[1].groups) == sampled and sampled <= judgments
    assert steps[1].metrics["resumed_groups"] == 2.0
