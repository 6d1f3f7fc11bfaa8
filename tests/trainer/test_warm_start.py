"""The warm start: demonstrations learnt by likelihood, only where the assistant wrote, in steps
that are recorded, checkpointed and swapped in as GRPO's are, and followed by GRPO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from art_proxy.config import TrainerConfig
from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.model_loading import load_model, model_files
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy_trainer.batch import TrainingSequence, demonstration_batch
from art_proxy_trainer.command import run_train
from art_proxy_trainer.demonstrations import (
    Demonstration,
    demonstration_sequences,
    read_demonstrations,
)
from art_proxy_trainer.errors import CheckpointError, DemonstrationError
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.loss import sft_loss
from art_proxy_trainer.scoring import score_sampled
from art_proxy_trainer.step import train_step
from art_proxy_trainer.warm_start import WarmStart
from tests.trainer.agents import untagged
from tests.trainer.conftest import TINY_NAME, Stack
from tests.trainer.records import call
from tests.trainer.test_demonstrations import CONVERSATION, TOOLS
from tests.trainer.test_training_loop import _settings


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_files(None).directory, local_files_only=True)


def _lines(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


def test_the_loss_is_the_mean_negative_log_likelihood_of_the_trained_tokens() -> None:
    logprobs_B_T = torch.tensor([[-9.0, -1.0, -2.0], [float("-inf"), -3.0, 0.0]])
    mask_B_T = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    result = sft_loss(logprobs_B_T.requires_grad_(), mask_B_T)
    assert float(result.loss.detach()) == pytest.approx((1.0 + 2.0 + 3.0) / 3)
    torch.autograd.backward(result.loss)
    assert logprobs_B_T.grad is not None
    torch.testing.assert_close(logprobs_B_T.grad, -mask_B_T / 3)  # context: no gradient, no nan
    assert result.metrics.tokens == 3 and result.metrics.clip_fraction == 0.0


def test_a_file_in_openai_fine_tuning_format_learns_the_weighted_assistant_turns(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    unweighted = [
        dict(m, weight=0) if m["role"] == "assistant" and m.get("tool_calls") else m
        for m in CONVERSATION
    ]
    path = _lines(
        tmp_path / "demos.jsonl",
        [{"messages": CONVERSATION, "tools": TOOLS}, {"messages": unweighted, "tools": TOOLS}],
    )
    both, answer_only = read_demonstrations(path)
    assert both.source == "demos.jsonl:1" and both.tools == TOOLS
    renderer, eos = ChatRenderer(tokenizer), int(tokenizer.eos_token_id)
    [whole] = demonstration_sequences(both, renderer, eos)
    [partial] = demonstration_sequences(answer_only, renderer, eos)
    assert whole.tokens == partial.tokens  # the same conversation, rendered alike
    learnt = tokenizer.decode([t for t, m in zip(partial.tokens, partial.mask, strict=True) if m])
    assert learnt == "The code word is quetzal-41.<|im_end|>"
    assert sum(whole.mask) > sum(partial.mask)
    assert set(whole.old_logprobs) == {0.0}  # no sampler: nothing recorded to correct for


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("{not json", r"demos\.jsonl:2: not JSON"),
        ('{"messages": "hi"}', r"demos\.jsonl:2: needs 'messages'"),
        ('{"messages": [], "tools": {}}', r"demos\.jsonl:2: 'tools' must be a list"),
    ],
)
def test_a_line_that_is_not_a_demonstration_is_named(tmp_path: Path, line: str, error: str) -> None:
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"messages": CONVERSATION}) + "\n" + line + "\n")
    with pytest.raises(DemonstrationError, match=error):
        read_demonstrations(path)


def test_an_export_line_reads_its_tools_from_its_last_call(tmp_path: Path) -> None:
    exported = {
        "messages": CONVERSATION,
        "trajectory": {"calls": [{"request": {"messages": CONVERSATION[:2], "tools": TOOLS}}]},
    }
    [demonstration] = read_demonstrations(_lines(tmp_path / "export.jsonl", [exported]))
    assert demonstration.tools == TOOLS


def test_a_trajectory_this_model_served_is_learnt_from_its_own_token_ids(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    served = [call(0, [1, 2, 3], [4, 5], [-0.5, -0.5]), call(1, [1, 2, 3, 4, 5, 6], [7], [-0.1])]
    demonstration = Demonstration("trajectory t1", CONVERSATION, TOOLS, served)
    [sequence] = demonstration_sequences(demonstration, ChatRenderer(tokenizer), 0)
    assert sequence.tokens == [1, 2, 3, 4, 5, 6, 7]  # never re-rendered
    assert sequence.mask == [0, 0, 0, 1, 1, 0, 1]
    assert set(sequence.old_logprobs) == {0.0}


def test_each_epoch_takes_every_demonstration_once_in_an_order_the_seed_fixes() -> None:
    def demonstration(n: int) -> list[TrainingSequence]:
        sequence = TrainingSequence(f"d{n}")
        sequence.add_context([1])
        sequence.add_demonstrated([n + 10])
        return [sequence]

    warm = WarmStart([demonstration(n) for n in range(5)], 2, 2, 7, 0)
    assert (warm.steps_per_epoch, warm.steps) == (3, 6)
    epochs = [
        [row for step in range(3 * e, 3 * e + 3) for row in warm.batch(step).trajectory_ids]
        for e in range(2)
    ]
    assert [sorted(rows) for rows in epochs] == [[f"d{n}" for n in range(5)]] * 2
    assert epochs[0] != epochs[1]  # each epoch its own order
    again = WarmStart([demonstration(n) for n in range(5)], 2, 2, 7, 0)
    assert again.batch(4).trajectory_ids == warm.batch(4).trajectory_ids  # resumable
    assert warm.batch(0).objective == "sft" and warm.epoch(4) == 2


def test_warm_start_steps_raise_the_likelihood_of_the_demonstration(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    config = TrainerConfig(learning_rate=1e-3)
    torch.manual_seed(0)
    model = lora_model(load_model(None).model, config)  # SmolLM2-135M-Instruct
    optimizer = make_optimizer(model, config)
    demonstration = Demonstration("d", CONVERSATION, TOOLS)
    batch = demonstration_batch(
        demonstration_sequences(demonstration, ChatRenderer(tokenizer), int(tokenizer.eos_token_id))
    )

    def nll() -> float:
        with torch.no_grad():
            logprobs = score_sampled(
                model, batch.tokens_B_T, batch.attention_mask_B_T, batch.mask_B_T
            ).logprobs_B_T
        return float(-(logprobs * batch.mask_B_T).sum() / batch.mask_B_T.sum())

    before = nll()
    losses = [train_step(model, optimizer, batch, config).loss for _ in range(5)]
    assert losses[0] == pytest.approx(before, rel=1e-4)  # the step's loss is that NLL
    assert nll() < before - 1.0, losses


async def test_a_warm_start_is_recorded_and_swapped_in_and_grpo_goes_on_from_it(
    stack: Stack, tmp_path: Path
) -> None:
    demos = _lines(tmp_path / "demos.jsonl", [{"messages": CONVERSATION, "tools": TOOLS}] * 3)
    out = tmp_path / "run"
    warm = {"sft": str(demos), "sft_batch_size": 2, "sft_epochs": 1, "val_every": 1}
    warm_only = _settings(stack, out, **warm, sft_only=True)
    summary = await run_train(warm_only, Console(quiet=True))
    assert summary.stopped == "warm start done (2 steps, --sft-only)"

    # The same command without --sft-only resumes after the warm start and trains with GRPO.
    summary = await run_train(
        _settings(stack, out, **warm, steps=1),
        Console(quiet=True),
    )
    assert summary.stopped == "reached --steps 1"
    store = await TrajectoryStore.open(stack.store_url, writer=False)
    try:
        steps = await store.training_steps(run="run")
        [alias] = await store.aliases()
    finally:
        await store.aclose()
    assert [(s.step, s.kind, s.status, s.swap) for s in steps] == [
        (1, "sft", "applied", "swapped"),
        (2, "sft", "applied", "swapped"),
        (3, "grpo", "applied", "swapped"),
    ]
    assert [s.groups for s in steps[:2]] == [{}, {}]  # a warm start consumes no group
    assert {"loss", "grad_norm", "tokens", "sft_epoch", "seconds_train"} <= set(steps[0].metrics)
    assert "clip_fraction" not in steps[0].metrics  # no sampler, no clip
    assert steps[2].metrics["val_reward"] >= 0 and "trained" in steps[2].groups.values()
    assert untagged(alias.model) == f"{TINY_NAME}@3"
    assert summary.trainer is not None
    # The base model validated before the warm start; the first GRPO step's validation, sampled
    # by the warm start's adapter (step 2's weights), validated it.
    assert [s for s, _ in summary.trainer.state.val_history] == [0, 2]
    # The run's first step carries the base model's validation, the dashboard's point at step 0.
    assert steps[0].metrics["val_reward_base"] == summary.trainer.state.val_history[0][1]
    assert all("val_reward_base" not in s.metrics for s in steps[1:])


async def test_a_warm_start_run_without_an_agent_goes_on_with_grpo_on_the_same_out(
    stack: Stack, tmp_path: Path
) -> None:
    """The warm start alone names no agent (`--sft ... --sft-only`); GRPO on the same `--out`
    names one: that is the run going on, as --sft-only promises, not another run."""
    demos = _lines(tmp_path / "demos.jsonl", [{"messages": CONVERSATION, "tools": TOOLS}] * 2)
    out = tmp_path / "run"
    warm = {"sft": str(demos), "sft_batch_size": 2, "sft_epochs": 1, "val_every": 0}
    alone = _settings(stack, out, **warm, sft_only=True, agent=None, scenarios=None)
    assert (await run_train(alone, Console(quiet=True))).stopped.startswith("warm start done")
    summary = await run_train(_settings(stack, out, **warm, steps=1), Console(quiet=True))
    assert summary.stopped == "reached --steps 1"
    # Once GRPO has run with an agent, another agent is another run.
    agents = Path(__file__).parent / "agents.py"
    other = _settings(stack, out, **warm, steps=2, agent=f"{agents}:scripted_validation_agent")
    with pytest.raises(CheckpointError, match="holds step 2 of another run"):
        await run_train(other, Console(quiet=True))
