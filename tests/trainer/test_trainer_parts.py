"""The trainer's parts on their own: micro-batches, temperatures, checkpoints, stopping rules."""

from __future__ import annotations

import io
import os
import re
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from rich.console import Console

from art_proxy.config import TrainerConfig, TrainSettings
from art_proxy.local.cli import set_torch_threads
from art_proxy.local.model_loading import load_model
from art_proxy.local.request_params import sampling_params
from art_proxy.records import CallRecord, GroupOutcome, TrainableGroup, TrainingStep
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.store.writer import Batch
from art_proxy.wire import ApiError, choice_count
from art_proxy_trainer.batch import TrajectorySample, build_batch
from art_proxy_trainer.checkpoint import Checkpoints, TrainerState
from art_proxy_trainer.command import TrainSummary, _Display, step_line
from art_proxy_trainer.errors import CheckpointError
from art_proxy_trainer.lora import make_optimizer
from art_proxy_trainer.memory import micro_batches
from art_proxy_trainer.metrics import MetricsSink
from art_proxy_trainer.policy import Policy, trained_parameters
from art_proxy_trainer.samples import trajectory_samples
from art_proxy_trainer.scoring import token_logprobs
from art_proxy_trainer.step import train_step
from art_proxy_trainer.swap import _same_model, adapter_name, step_of
from art_proxy_trainer.trainer import Trainer
from art_proxy_trainer.validation import validated_step
from tests.store_rows import call_row, group_row, scenario_row, trajectory_row
from tests.trainer.records import call
from tests.trainer.test_step import _model


def _grads(config: TrainerConfig, batch_rows: list[TrajectorySample]) -> dict[str, torch.Tensor]:
    model = _model(config)
    optimizer = make_optimizer(model, config)
    batch = build_batch(batch_rows)
    # Capture the gradient the optimiser would apply by stepping with lr so small nothing moves.
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    result = train_step(model, optimizer, batch, config)
    assert result.applied
    return {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}


def _samples() -> list[TrajectorySample]:
    rows = []
    for index, length in enumerate((3, 9, 5, 12)):
        prompt = list(range(1, 6 + index))
        completion = [(7 * index + t) % 100 + 1 for t in range(length)]
        logprobs = [-1.0 - 0.1 * t for t in range(length)]
        calls = [call(0, prompt, completion, logprobs, trajectory_id=f"t{index}")]
        rows.append(TrajectorySample(f"t{index}", calls, advantage=(-1.0) ** index))
    return rows


def test_micro_batches_give_the_same_update_as_the_whole_batch() -> None:
    whole = _grads(TrainerConfig(learning_rate=1e-3, micro_batch_tokens=0), _samples())
    chunked = _grads(TrainerConfig(learning_rate=1e-3, micro_batch_tokens=20), _samples())
    for name, update in whole.items():
        torch.testing.assert_close(chunked[name], update, rtol=1e-4, atol=1e-6)


def test_micro_batches_cut_rows_by_padded_tokens() -> None:
    batch = build_batch(_samples())  # rows of 8, 15, 12 and 20 tokens
    assert micro_batches(batch, 0) == [slice(0, 4)]
    assert micro_batches(batch, 30) == [slice(0, 2), slice(2, 3), slice(3, 4)]


def test_tokens_are_scored_at_the_temperature_they_were_sampled_at() -> None:
    hot = call(0, [1, 2], [3, 4], [-0.5, -0.7]).model_copy(
        update={"sampling": {"temperature": 0.5}}
    )
    batch = build_batch([TrajectorySample("t1", [hot], 1.0)])
    assert batch.transforms.temperatures_B_T is not None
    assert batch.transforms.temperatures_B_T.tolist() == [[1.0, 1.0, 0.5, 0.5]]
    logits_B_T_V = torch.randn(1, 4, 10)
    tokens_B_T = torch.tensor([[1, 2, 3, 4]])
    scored = token_logprobs(logits_B_T_V, tokens_B_T, batch.transforms)
    expected = torch.log_softmax(logits_B_T_V[0, 2] / 0.5, dim=-1)[4]
    assert scored[0, 3].item() == pytest.approx(expected.item(), rel=1e-5)
    # An unset temperature, or greedy decoding, scores at 1.
    plain = build_batch([TrajectorySample("t1", [call(0, [1, 2], [3], [-0.5])], 1.0)])
    assert plain.transforms.temperatures_B_T is None


def test_a_tiny_temperature_is_scored_as_vllm_samples_it_at_its_lowest_not_as_greedy() -> None:
    """vLLM raises a temperature above 0 and under 0.01 to 0.01 before it reads greedy decoding
    (sampling_params.py `_MAX_TEMP`), so such a call samples, with its top-p; only 0 is greedy.
    The local server samples so too."""
    for asked in (1e-6, 5e-3, 0.01):
        tiny = call(0, [1, 2], [3, 4], [-0.5, -0.7]).model_copy(
            update={"sampling": {"temperature": asked, "top_p": 0.9}}
        )
        transforms = build_batch([TrajectorySample("t1", [tiny], 1.0)]).transforms
        assert transforms.temperatures_B_T is not None, asked
        temperatures = transforms.temperatures_B_T.tolist()[0]
        assert temperatures == pytest.approx([1.0, 1.0, 0.01, 0.01]), asked
        assert transforms.top_p_B_T is not None, asked
    body = {"temperature": 1e-6, "top_p": 0.9}
    assert sampling_params(body, max_tokens=4, vocab_size=8, top_logprobs=0).temperature == 0.01
    assert (
        sampling_params({"temperature": 0}, max_tokens=4, vocab_size=8, top_logprobs=0).temperature
        == 0
    )
    assert choice_count({**body, "n": 2}) == 2  # vLLM takes n > 1 there: it samples
    with pytest.raises(ApiError, match="greedy"):
        choice_count({"temperature": 0, "n": 2})


def test_the_step_of_an_adapter_is_read_off_its_name() -> None:
    assert step_of("policy@12", "policy") == 12
    assert step_of("policy@12-3f9a1c", "policy") == 12  # named with its run's tag
    assert step_of("policy", "policy") == 0
    assert step_of("other@3", "policy") == 0
    assert step_of(None, "policy") == 0


def test_a_new_run_draws_a_tag_for_its_adapters_and_an_older_checkpoint_keeps_its_names(
    tmp_path: Path,
) -> None:
    first, second = TrainerState(run="r"), TrainerState(run="r")
    assert re.fullmatch("[0-9a-f]{6}", first.run_tag) and first.run_tag != second.run_tag
    (tmp_path / "state.json").write_text(first.model_dump_json())
    assert TrainerState.read(tmp_path / "state.json").run_tag == first.run_tag
    (tmp_path / "state.json").write_text('{"run": "r", "step": 3}')  # from before tags
    assert TrainerState.read(tmp_path / "state.json").run_tag == ""


@pytest.mark.parametrize(
    ("entry", "names", "same"),
    [
        ({"id": "SmolLM2", "root": "/x/model.gguf"}, {"SmolLM2"}, True),
        ({"id": "Qwen/Qwen2.5-7B", "root": "Qwen/Qwen2.5-7B"}, {"/models/Qwen2.5-7B"}, True),
        ({"id": "Qwen/Qwen2.5-7B", "root": "Qwen/Qwen2.5-7B"}, {"/models/Llama-3-8B"}, False),
    ],
)
def test_a_base_model_matches_by_name_root_or_last_path_part(
    entry: dict[str, Any], names: set[str], same: bool
) -> None:
    assert _same_model(entry, names) is same


def _group(rewards: list[float], split: str = "train") -> TrainableGroup:
    return TrainableGroup.model_validate(
        {
            "group_id": "g",
            "scenario_id": "s",
            "split": split,
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
            "rewards": {f"t{n}": reward for n, reward in enumerate(rewards)},
            "judge_cost_usd": 0.0,
        }
    )


def _trained_policy(config: TrainerConfig) -> Policy:
    """A policy one step away from its fresh adapter (and with AdamW state)."""
    model = _model(config)
    optimizer = make_optimizer(model, config)
    assert train_step(model, optimizer, build_batch(_samples()), config).applied
    return Policy(model, optimizer, 0, "m", {"m"})


def test_a_checkpoint_restores_the_adapter_and_optimizer(tmp_path: Path) -> None:
    config = TrainerConfig(learning_rate=1e-2)
    policy = _trained_policy(config)
    model, optimizer = policy.model, policy.optimizer
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(model, policy.state(), TrainerState(run="r", step=1))

    fresh = _model(config)
    fresh_optimizer = make_optimizer(fresh, config)
    state = checkpoints.latest()
    assert state is not None and state.step == 1
    checkpoints.restore(state, Policy(fresh, fresh_optimizer, 0, "m", {"m"}))
    for (name, trained), (_, restored) in zip(
        model.named_parameters(), fresh.named_parameters(), strict=True
    ):
        torch.testing.assert_close(restored, trained, msg=name)
    assert fresh_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    assert (tmp_path / "checkpoints" / "step-000001" / "adapter" / "adapter_config.json").is_file()


def test_the_best_pointer_names_only_a_checkpoint_still_kept(tmp_path: Path) -> None:
    """A validation served by an adapter older than those kept loaded names pruned weights."""
    checkpoints = Checkpoints(tmp_path)
    policy = _trained_policy(TrainerConfig())
    checkpoints.save(policy.model, policy.state(), TrainerState(run="r", step=2))
    checkpoints.mark_best(2)
    checkpoints.mark_best(1)  # never saved here: pruned
    assert checkpoints._pointed("best") == 2


def test_a_damaged_pointer_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "latest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"latest\.json"):
        Checkpoints(tmp_path).latest()


def _trainer(tmp_path: Path, **settings: Any) -> Trainer:
    model = _model(TrainerConfig())
    policy = Policy(model, make_optimizer(model, TrainerConfig()), 0, "m", {"m"})
    config = TrainSettings.model_validate({"out": str(tmp_path), **settings})
    return Trainer(config, None, policy, Checkpoints(tmp_path), MetricsSink(tmp_path), None)  # type: ignore[arg-type]  # no store needed


def test_rising_training_reward_with_falling_validation_is_flagged(tmp_path: Path) -> None:
    warnings: list[str] = []
    trainer = _trainer(tmp_path)
    trainer.stopping.on_warning = warnings.append
    trainer.state.reward_history = [(1, 0.2), (2, 0.3), (3, 0.6), (4, 0.9)]
    trainer.stopping.validated(trainer.state, 0, 0.7)  # the base model's validation
    trainer.state.step = 4
    trainer.stopping.validated(trainer.state, 4, 0.4)
    assert len(warnings) == 1 and "reward hacking" in warnings[0]


def test_validation_without_improvement_for_patience_rounds_is_a_plateau(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, patience=2, min_delta=0.05)
    for step, reward in ((0, 0.5), (5, 0.52), (10, 0.54)):
        trainer.stopping.validated(trainer.state, step, reward)
    assert trainer.stopping.plateaued()
    assert trainer.state.best_step == 0


async def _seed_group(
    store: TrajectoryStore, split: str, served_by: str, rewards: list[float]
) -> TrainableGroup:
    """A finished group in `store` whose calls `served_by` answered (trainable, tokens of the
    tiny model's vocabulary), and its rewards as the trainer gets them."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    scenario, group = f"s-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rows = [scenario_row(scenario, at), group_row(group, scenario, at)]
    members = {f"{group[:8]}-{index}": reward for index, reward in enumerate(rewards)}
    for trajectory in members:
        rows.append(trajectory_row(trajectory, scenario, group, at, split=split, call_count=1))
        rows.append(
            call_row(
                trajectory,
                at,
                model=served_by,
                response={},
                prompt_token_ids=[1, 2],
                completion_token_ids=[[3, 4]],
                logprobs=[[-0.5, -0.7]],
                trainable=True,
            )
        )
    await store.write(Batch(rows))
    return TrainableGroup.model_validate(
        {
            "group_id": group,
            "scenario_id": scenario,
            "created_at": at,
            "split": split,
            "rewards": members,
            "judge_cost_usd": 0.0,
        }
    )


async def test_the_best_checkpoint_is_the_weights_its_validation_was_served_by(
    tmp_path: Path, store: TrajectoryStore
) -> None:
    """A step's validation is sampled before it trains, by the adapter then served: the best
    checkpoint is that adapter's step, not the step whose weights nobody validated yet."""
    trainer = _trainer(tmp_path, val_every=1)
    trainer.store = store
    trainer.state.step = trainer.state.policy_step = 1  # as a run that trained step 1 is
    trainer.checkpoints.save(trainer.policy.model, trainer.policy.state(), trainer.state)
    served = adapter_name(trainer.alias, 1, trainer.state.run_tag)
    val = await _seed_group(store, "val", served, [0.8, 0.6])
    train = await _seed_group(store, "train", served, [0.0, 1.0])

    with trainer.sink:
        record = await trainer.train([train, val], extra_metrics={"val_reward": 0.7})

    assert record.step == 2 and record.status == "applied"
    assert trainer.state.best_step == 1
    assert trainer.checkpoints._pointed("best") == 1
    assert trainer.checkpoints.path(1).is_dir()  # kept: the best is never pruned


def test_a_validation_is_of_the_one_weights_of_this_run_that_served_it() -> None:
    tag = "3f9a1c"
    assert validated_step({"m@2-3f9a1c": 0.5}, "m", tag) == 2
    # Served by two adapters (a swap came while it ran): a mix, credited to neither (it was
    # credited to the oldest, ranking step 1's checkpoint on step 2's rollouts).
    assert validated_step({"m@2-3f9a1c": 0.5, "m@1-3f9a1c": 0.7}, "m", tag) is None
    assert validated_step({"SmolLM2-135M-Instruct": 0.4}, "m", tag) == 0  # the base model
    assert validated_step({"m@4-aaaaaa": 0.9}, "m", tag) is None  # another run's adapter
    assert validated_step({"m@4": 0.9}, "m", "") == 4  # a run from before tags


def _served(group_id: str, model: str) -> tuple[TrainableGroup, dict[str, list[CallRecord]]]:
    """A group of two trajectories with different rewards, both served by `model`."""
    group = _group([0.0, 1.0]).model_copy(update={"group_id": group_id})
    calls = {
        t: [call(0, [1, 2], [3], [-0.5], trajectory_id=t).model_copy(update={"model": model})]
        for t in group.rewards
    }
    return group, calls


def _samples_of(
    trainer: Trainer,
    groups: list[TrainableGroup],
    calls: dict[str, list[CallRecord]],
    outcomes: dict[str, GroupOutcome],
    metrics: dict[str, float],
) -> list[TrajectorySample]:
    """The samples `trainer`'s next step would train on, as its step picks them."""
    return trajectory_samples(
        groups,
        calls,
        outcomes,
        metrics,
        applied_steps=trainer.state.applied_steps,
        alias=trainer.alias,
        run_tag=trainer.state.run_tag,
        staleness_bound=trainer.settings.staleness_bound,
        scale_by_std=trainer.settings.scale_advantages_by_std,
    )


def test_staleness_counts_from_the_weights_trained_not_from_the_step_number(
    tmp_path: Path,
) -> None:
    trainer = _trainer(tmp_path, alias="policy", max_staleness=1)
    # Steps 1 and 2 were abandoned (no signal): the weights are still the base model's.
    trainer.state.step = 2
    base, base_calls = _served("base", "policy")
    outcomes: dict[str, GroupOutcome] = {}
    assert len(_samples_of(trainer, [base], base_calls, outcomes, {})) == 2
    assert outcomes == {"base": "trained"}
    # Steps 3 and 4 changed the weights: the base model is two changes old, adapter 3 one.
    trainer.state.policy_step, trainer.state.applied_steps = 4, [3, 4]
    outcomes = {}
    _samples_of(trainer, [base], base_calls, outcomes, {})
    old, old_calls = _served("old", adapter_name("policy", 3, trainer.state.run_tag))
    _samples_of(trainer, [old], old_calls, outcomes, {})
    assert outcomes == {"base": "stale", "old": "trained"}


def test_an_abandoned_step_ages_no_group_sampled_before_it(tmp_path: Path) -> None:
    """The overlapped loop with K = 1 after a step without signal: step 2 was abandoned, so the
    batch adapter 1 sampled while step 2 ran is trained into step 3's weights, one change of the
    weights behind (counted in step numbers it read as two, and every (K+1)-th batch after one
    abandoned step was thrown away as stale for the rest of the run)."""
    trainer = _trainer(
        tmp_path, alias="policy", max_staleness=16, max_off_policy_steps=1, objective="tis"
    )
    trainer.state.step, trainer.state.policy_step, trainer.state.applied_steps = 3, 3, [1, 3]
    group, calls = _served("batch4", adapter_name("policy", 1, trainer.state.run_tag))
    outcomes: dict[str, GroupOutcome] = {}
    metrics: dict[str, float] = {}
    assert len(_samples_of(trainer, [group], calls, outcomes, metrics)) == 2
    assert outcomes == {"batch4": "trained"}
    assert metrics["staleness_max"] == 1.0


def test_the_staleness_figures_are_of_every_group_a_step_consumes(tmp_path: Path) -> None:
    """A step whose groups were all consumed as stale reports how stale they were (the chart
    was blank exactly where the bound bit)."""
    trainer = _trainer(tmp_path, alias="policy", max_staleness=1)
    trainer.state.step, trainer.state.policy_step, trainer.state.applied_steps = 3, 3, [1, 2, 3]
    group, calls = _served("old", adapter_name("policy", 1, trainer.state.run_tag))
    outcomes: dict[str, GroupOutcome] = {}
    metrics: dict[str, float] = {}
    assert _samples_of(trainer, [group], calls, outcomes, metrics) == []
    assert outcomes == {"old": "stale"}
    assert (metrics["staleness_max"], metrics["stale_groups"]) == (2.0, 1.0)


def test_a_group_another_runs_adapter_served_is_past_any_staleness_bound(tmp_path: Path) -> None:
    """Its weights lie on no step of this run (an earlier run's adapter, still served after a new
    `--out`): its step number, read as this run's, made it steps ahead and so fresh."""
    trainer = _trainer(tmp_path, alias="policy", max_staleness=1)
    trainer.state.step = trainer.state.policy_step = 2
    foreign, calls = _served("foreign", "policy@40-aaaaaa")
    outcomes: dict[str, GroupOutcome] = {}
    _samples_of(trainer, [foreign], calls, outcomes, {})
    assert outcomes == {"foreign": "stale"}
    # Without a bound it trains (its recorded logprobs are its sampler's), counted apart.
    unbounded = _trainer(tmp_path / "unbounded", alias="policy", max_staleness=0)
    unbounded.state.step = unbounded.state.policy_step = 2
    outcomes, metrics = {}, dict[str, float]()
    assert len(_samples_of(unbounded, [foreign], calls, outcomes, metrics)) == 2
    assert outcomes == {"foreign": "trained"}
    assert metrics["groups_of_other_runs"] == 1 and "staleness_max" not in metrics


def test_the_sidecar_consumes_groups_past_max_off_policy_steps_as_stale(tmp_path: Path) -> None:
    """Production traffic cannot wait for admission: in the sidecar, --max-off-policy-steps K
    bounds staleness as the whole loop's pipeline does, tighter than --max-staleness."""
    trainer = _trainer(
        tmp_path, alias="policy", max_staleness=16, max_off_policy_steps=1, objective="tis"
    )
    trainer.state.step = trainer.state.policy_step = 3
    trainer.state.applied_steps = [1, 2, 3]
    outcomes: dict[str, GroupOutcome] = {}
    for name, step in (("old", 1), ("recent", 2)):  # 2 and 1 steps behind
        group, calls = _served(name, adapter_name("policy", step, trainer.state.run_tag))
        _samples_of(trainer, [group], calls, outcomes, {})
    assert outcomes == {"old": "stale", "recent": "trained"}


def test_a_checkpoint_from_before_policy_step_takes_its_step_for_it() -> None:
    state = TrainerState.model_validate({"run": "r", "step": 7})
    assert state.policy_step == 7
    assert TrainerState.model_validate({"run": "r", "step": 7, "policy_step": 5}).policy_step == 5


def test_torch_threads_are_the_setting_or_one_per_usable_core() -> None:
    before = torch.get_num_threads()
    try:
        set_torch_threads(1)
        assert torch.get_num_threads() == 1
        set_torch_threads(0)
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)
    assert TrainSettings.model_validate({"threads": 1}).threads == 1


def test_loading_the_model_prints_no_progress_bar_of_transformers(
    tiny_model_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    load_model(str(tiny_model_dir))

    captured = capfd.readouterr()
    assert "Loading weights" not in captured.out + captured.err


def test_an_abandoned_step_checkpoints_no_weights_and_resumes_from_the_last_applied(
    tmp_path: Path,
) -> None:
    config = TrainerConfig(learning_rate=1e-2)
    policy = _trained_policy(config)
    model = policy.model
    checkpoints = Checkpoints(tmp_path)
    checkpoints.save(model, policy.state(), TrainerState(run="r", step=1, policy_step=1))
    checkpoints.save(model, None, TrainerState(run="r", step=2, policy_step=1))  # stale
    assert not (tmp_path / "checkpoints" / "step-000002" / "adapter").exists()
    checkpoints.prune(set())
    assert (tmp_path / "checkpoints" / "step-000001" / "adapter").is_dir()

    fresh = _model(config)
    state = checkpoints.latest()
    assert state is not None and (state.step, state.policy_step) == (2, 1)
    checkpoints.restore(state, Policy(fresh, make_optimizer(fresh, config), 0, "m", {"m"}))
    for (name, trained), (_, restored) in zip(
        model.named_parameters(), fresh.named_parameters(), strict=True
    ):
        torch.testing.assert_close(restored, trained, msg=name)


def test_a_step_line_is_one_line_where_output_is_not_a_terminal() -> None:
    """`up` relays the trainer's lines through a pipe, where a console is 80 columns wide."""
    out = io.StringIO()
    console = Console(file=out, width=80)
    record = TrainingStep(
        run="r",
        step=7,
        status="applied",
        swap="swapped",
        metrics={"reward_mean": 0.5, "reward_std": 0.2, "loss": 0.1, "tokens": 123.0},
        created_at=datetime.now(UTC),
    )
    with _Display(console, TrainSettings()) as display:
        display.step(record)
    header, line = out.getvalue().splitlines()[:2]
    assert header.split()[0] == "step" and header.split()[-1] == "swap"
    assert line.split()[0] == "7" and line.split()[-1] == "swapped"


def test_the_summary_and_the_step_lines_name_validations_and_steps_alike() -> None:
    """Validations printed on steps 5/10/15/20 were @4/@9/@14/@19 in the summary, step 1's line
    showed `val -` though the base model was validated, and a last step abandoned was counted in
    "steps 20" while step 19's adapter served."""
    record = TrainingStep(
        run="r",
        step=1,
        status="applied",
        swap="swapped",
        metrics={"reward_mean": 0.5, "val_reward_base": 0.15},
        created_at=datetime.now(UTC),
    )
    cells = step_line(record).split()
    assert cells[3] == "0.150"  # step 1's `val`: the weights it started from, the base model's
    state = TrainerState(
        run="r",
        step=20,
        applied_steps=list(range(1, 20)),
        val_history=[(0, 0.15), (4, 0.5), (19, 0.9)],
        best_step=19,
        best_val=0.9,
        loaded_adapters=["agent@19-abc123"],
    )
    summary = TrainSummary(TrainSettings(), "agent")
    summary.trainer = cast(
        Trainer, SimpleNamespace(state=state, stopping=SimpleNamespace(warnings=[]))
    )
    out = io.StringIO()
    Console(file=out, width=200).print(summary.table())
    text = out.getvalue()
    assert "20 (19 applied, 1 abandoned)" in text
    assert "0.15@1, 0.50@5, 0.90@20" in text
    assert "the adapter of step 19 (val 0.90, on step 20's line)" in text
    assert "agent@19-abc123" in text


def test_a_guided_retry_is_measured_against_its_unguided_group(tmp_path: Path) -> None:
    """The hint rescued every retry: as a group of its own it has no spread; pooled with the
    failures of the policy being trained it has the most to teach."""
    trainer = _trainer(tmp_path)
    plain = _group([0.0, 0.0, 0.0, 0.0]).model_copy(update={"group_id": "plain"})
    retry = TrainableGroup.model_validate(
        {
            **_group([1.0, 1.0, 1.0, 1.0]).model_dump(),
            "group_id": "retry",
            "rewards": {f"hinted{n}": 1.0 for n in range(4)},
            "baseline_group": "plain",
        }
    )
    calls = {
        t: [call(0, [1, 2], [3], [-0.5], trajectory_id=t)]
        for group in (plain, retry)
        for t in group.rewards
    }
    outcomes: dict[str, GroupOutcome] = {}
    samples = _samples_of(trainer, [plain, retry], calls, outcomes, {})
    assert outcomes == {"plain": "trained", "retry": "trained"}
    assert {s.trajectory_id: s.advantage for s in samples} == {
        **{t: -0.5 for t in plain.rewards},
        **{t: 0.5 for t in retry.rewards},
    }
    # Partly rescued: the successes count against the failures of the policy trained (3 of 8).
    partly = retry.model_copy(update={"rewards": {"h0": 1.0, "h1": 1.0, "h2": 1.0, "h3": 0.0}})
    samples = _samples_of(trainer, [plain, partly], calls, {}, {})
    assert {s.trajectory_id: s.advantage for s in samples}["h0"] == pytest.approx(1 - 3 / 8)


async def test_the_first_grpo_step_after_a_warm_start_has_an_optimiser_of_its_own(
    tmp_path: Path,
) -> None:
    trainer = _trainer(tmp_path, learning_rate=1e-2)
    policy = trainer.policy
    sft = replace(build_batch(_samples()), objective="sft")
    for _ in range(3):
        assert await trainer._optimise_batch(sft, {}, trainer.settings, "sft") == ("applied", None)
    grpo = build_batch(_samples())
    weights = {n: p.detach().clone() for n, p in trained_parameters(policy.model)}
    assert await trainer._optimise_batch(grpo, {}, trainer.settings, "grpo") == ("applied", None)
    # What a fresh AdamW takes from the same weights on the same batch.
    fresh = _model(TrainerConfig())
    fresh.load_state_dict(policy.model.state_dict())
    fresh.load_state_dict(weights, strict=False)
    fresh_optimizer = make_optimizer(fresh, trainer.settings)
    assert train_step(fresh, fresh_optimizer, grpo, trainer.settings).applied
    assert {int(s["step"]) for s in policy.optimizer.state.values()} == {1}
    for (name, got), (_, expected) in zip(
        trained_parameters(policy.model), trained_parameters(fresh), strict=True
    ):
        torch.testing.assert_close(got, expected, msg=name)
    # The state is the checkpoint's: a resumed run does not clear it again.
    assert trainer.state.optimizer_kind == "grpo"
    assert await trainer._optimise_batch(grpo, {}, trainer.settings, "grpo") == ("applied", None)
    assert {int(s["step"]) for s in policy.optimizer.state.values()} == {2}


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"objective": "ppo", "updates_per_batch": 2}, "is for --objective tis or mis"),
        ({"objective": "mis", "guided_retries": True}, "--guided-retries needs --objective tis"),
        ({"objective": "ppo", "guided_retries": True}, "--guided-retries needs --objective tis"),
    ],
)
def test_combinations_that_would_train_wrong_are_refused(
    settings: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(ValueError, match=refusal):
        TrainSettings.model_validate(settings)


async def test_a_step_of_several_updates_records_their_means_and_the_last(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, learning_rate=1e-2, updates_per_batch=4)
    metrics: dict[str, float] = {}
    status = await trainer._optimise_batch(
        build_batch(_samples()), metrics, trainer.settings, "grpo"
    )
    assert status == ("applied", None)
    assert metrics["updates"] == 4.0
    assert {"loss", "clip_fraction", "update_drift"} <= set(metrics)
    assert {"loss_last", "clip_fraction_last", "update_drift_last"} <= set(metrics)
    assert metrics["update_drift_last"] > metrics["update_drift"] > 0  # the first update: 0


def test_the_summarys_reward_row_fits_a_line_for_a_long_run() -> None:
    """`make demo`'s summary cut 20 steps' rewards after 16, with a dangling `->`."""
    from art_proxy_trainer.command import _reward_row

    rewards = [(step, step / 20) for step in range(1, 21)]
    row = _reward_row(rewards)
    assert row == ("0.05@1 -> ... -> 0.85@17 -> 0.90@18 -> 0.95@19 -> 1.00@20 (best 1.00@20)")
    assert len(row) <= 76 and not row.rstrip().endswith("->")
    assert _reward_row([(1, 0.1), (2, 0.3)]) == "0.10@1 -> 0.30@2"
    assert _reward_row([]) == "-"
