"""`trainer_step.py`'s sizes, records and batch: a GRPO batch of the bundled model's own samples, recorded as the proxy records them."""

from __future__ import annotations

import itertools
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from peft import PeftModel
from rich.console import Console
from transformers import GenerationMixin, PreTrainedTokenizerBase

from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.model_loading import LoadedModel
from art_proxy.records import CallRecord
from art_proxy_trainer.advantages import group_advantages
from art_proxy_trainer.batch import TrainingBatch, TrajectorySample, build_batch
from art_proxy_trainer.scoring import token_logprobs

REPO = Path(__file__).resolve().parents[1]
# The target: a training step costs at most this many raw forward+backward passes.
MAX_STEP_VS_RAW = 1.2
# A usual GRPO KL weight; any value > 0 adds the same reference forward, so the time ignores it.
KL_COEF = 0.04
SEED = 0
# An agent's own system prompt, short: SmolLM2's template would otherwise add its default one.
SYSTEM_PROMPT = "You are the assistant of a travel agency."
# The user message grows by these sentences until the templated prompt is long enough.
TASK_SENTENCES = (
    "You are helping a customer who booked a flight from Lisbon to Oslo next Tuesday.",
    "They want to move it to Wednesday morning and keep their seat by the window.",
    "Check the fare rules first, then explain the change fee in plain words.",
    "If the fee is more than fifty euros, offer the refundable fare instead.",
    "Keep the answer short, friendly, and end with the next step they should take.",
)

# The arms' names, as the report prints them.
RAW = "raw peft forward+backward + AdamW"
STEP = "train_step"
STEP_KL = f"train_step, kl_coef {KL_COEF:g}"
FORWARD = "no-grad forward (for scale)"

# Wide enough for the report when the output goes to a file or CI log (rich assumes 80 there).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


@dataclass(frozen=True)
class Sizes:
    group: int
    prompt_tokens: int
    completion_tokens: int
    repeats: int
    warm_up: bool = True  # a round of every arm before timing; the smoke run skips it


QUICK = Sizes(group=2, prompt_tokens=8, completion_tokens=2, repeats=1, warm_up=False)


@dataclass(frozen=True)
class Arm:
    """One thing timed: a name and a call that runs it once on the batch."""

    name: str
    run: Callable[[], object]


@dataclass(frozen=True)
class Report:
    sizes: Sizes
    batch: TrainingBatch
    seconds: dict[str, list[float]]
    load_before: float
    load_after: float

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def best(self, name: str) -> float:
        return min(self.seconds[name])

    def median_ratio(self, name: str) -> float:
        return self.median(name) / self.median(RAW)

    def best_ratio(self, name: str) -> float:
        return self.best(name) / self.best(RAW)


# ---------------------------------------------------------------- the batch


def chat_prompt(tokenizer: PreTrainedTokenizerBase, tokens: int) -> list[int]:
    """A system and a user message through local-llm's chat template, >= `tokens` ids."""
    renderer = ChatRenderer(tokenizer)
    sentences: list[str] = []
    for sentence in itertools.cycle(TASK_SENTENCES):
        sentences.append(sentence)
        user = {"role": "user", "content": " ".join(sentences)}
        ids = renderer.render([{"role": "system", "content": SYSTEM_PROMPT}, user], None)
        if len(ids) >= tokens:
            return ids
    raise AssertionError("unreachable: the sentences cycle forever")


def sample_completions(loaded: LoadedModel, prompt: list[int], sizes: Sizes) -> list[list[int]]:
    """`sizes.group` completions sampled at temperature 1, each cut after its first EOS."""
    generator, tokenizer = loaded.model, loaded.tokenizer
    assert isinstance(generator, GenerationMixin)  # a causal LM: load_model's AutoModelForCausalLM
    with torch.random.fork_rng(), torch.inference_mode():
        torch.manual_seed(SEED)
        out_G_T = generator.generate(  # type: ignore[misc,unused-ignore]  # some transformers releases' self-type Protocol rejects their own models
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=sizes.completion_tokens,
            num_return_sequences=sizes.group,
            pad_token_id=tokenizer.pad_token_id,
        )
    assert isinstance(out_G_T, torch.Tensor)  # the ids alone: no return_dict_in_generate
    completions = []
    for row in out_G_T[:, len(prompt) :].tolist():
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        completions.append(row[:end])
    return completions


def completion_logprobs(
    model: PeftModel, prompt: list[int], completions: list[list[int]]
) -> list[list[float]]:
    """pi_old of each sampled token: the adapter as it is now, so every first ratio is 1."""
    length = len(prompt) + max(len(c) for c in completions)
    tokens_G_T = torch.zeros((len(completions), length), dtype=torch.int64)
    attention_G_T = torch.zeros_like(tokens_G_T)
    for row, completion in enumerate(completions):
        ids = prompt + completion
        tokens_G_T[row, : len(ids)] = torch.tensor(ids)
        attention_G_T[row, : len(ids)] = 1
    with torch.no_grad():
        logits = model(input_ids=tokens_G_T, attention_mask=attention_G_T).logits
        logprobs_G_T = token_logprobs(logits, tokens_G_T)
    start = len(prompt)
    return [logprobs_G_T[row, start : start + len(c)].tolist() for row, c in enumerate(completions)]


def recorded_call(
    trajectory_id: str, prompt: list[int], completion: list[int], logprobs: list[float]
) -> CallRecord:
    """One chat call as the proxy stores it: the ids and logprobs are what the trainer reads."""
    return CallRecord(
        id=f"{trajectory_id}-c0",
        trajectory_id=trajectory_id,
        seq=0,
        kind="chat",
        created_at=datetime.now(UTC),
        latency_ms=0.0,
        upstream="http://bench",
        status="ok",
        http_status=200,
        stream=False,
        model="SmolLM2-135M-Instruct",
        request={},
        response={},
        sampling={"temperature": 1.0},
        prompt_token_ids=prompt,
        completion_token_ids=[completion],
        logprobs=[logprobs],
        trainable=True,
        stitched=False,
        attribution="url",
    )


def grpo_batch(loaded: LoadedModel, model: PeftModel, sizes: Sizes) -> TrainingBatch:
    """The group's batch; `model` is the adapter `loaded.model` was wrapped in (still a no-op)."""
    tokenizer = loaded.tokenizer
    prompt = chat_prompt(tokenizer, sizes.prompt_tokens)
    completions = sample_completions(loaded, prompt, sizes)
    logprobs = completion_logprobs(model, prompt, completions)
    ids = [f"t{i}" for i in range(sizes.group)]
    # Spread rewards, as a judge gives a group: every row gets a different, nonzero advantage.
    rewards = {trajectory_id: i / sizes.group for i, trajectory_id in enumerate(ids)}
    advantages = group_advantages({"g0": rewards}).by_trajectory
    samples = [
        TrajectorySample(
            trajectory_id, [recorded_call(trajectory_id, prompt, c, lp)], advantages[trajectory_id]
        )
        for trajectory_id, c, lp in zip(ids, completions, logprobs, strict=True)
    ]
    pad_token_id = tokenizer.pad_token_id
    assert isinstance(pad_token_id, int)  # SmolLM2's tokenizer sets one
    return build_batch(samples, pad_token_id=pad_token_id)
