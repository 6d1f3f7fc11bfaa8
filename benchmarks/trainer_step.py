"""What a GRPO step costs over a raw peft forward+backward on the same tokens.

One run loads the bundled SmolLM2-135M-Instruct as the trainer will (`load_model(None)`, float32),
wraps it with the trainer's `lora_model` (default `TrainerConfig`: r=8 on every linear projection)
and builds one realistic GRPO batch the trainer's way: a group of `--group` trajectories that share
a chat-templated prompt of about `--prompt-tokens` tokens, each with a completion of at most
`--completion-tokens` tokens sampled from the model (temperature 1, EOS ends a row early), made
into `CallRecord`s, `TrajectorySample`s with group-relative advantages, and `build_batch`. The old
logprobs come from one no-grad forward of the adapter as it is before the first step, so the
ratios start at 1: the on-policy case.

On that batch it times, taking turns and after a warm-up of each (which also makes AdamW's state):

- `raw`: the baseline, a forward+backward of the same peft model on the same `tokens_B_T` and
  `attention_mask_B_T` with a plain policy-gradient loss (the masked mean of the sampled tokens'
  logprobs times their advantage) and `optimizer.step()` of the same AdamW the trainer makes;
- `train_step`, the trainer's step (clipped GRPO loss, finite checks, grad-norm clip, step);
- `train_step` with `kl_coef > 0`, which adds one no-grad forward with the adapter off;
- a no-grad forward alone, for scale: what the KL's reference pass costs.

Each figure is the median of `--repeats` rounds (each arm's best round is shown beside it), and
the load average before and after is printed with them. torch keeps its default thread count (one
per core) unless `--threads` says otherwise: while another process keeps every core busy, torch's
threads wait on each other at every parallel region and a step can take up to 7x longer from one
round to the next, which swamps the ratio; with `--threads 1` the rounds stay within ~15%.

    .venv/bin/python benchmarks/trainer_step.py [--group 8] [--prompt-tokens 120]
        [--completion-tokens 32] [--repeats 5] [--threads 0] [--quick] [--nproc 1]

With `--nproc N` (N > 1) it measures the same batch's step on N ranks instead (trainer_ranks.py):
N ranks against one process, DDP and FSDP2, and what each rank holds of a larger model.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from peft import PeftModel
from rich.console import Console
from rich.table import Table
from transformers import GenerationMixin, PreTrainedTokenizerBase

from art_proxy.config import TrainerConfig
from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.model_loading import LoadedModel, load_model
from art_proxy.records import CallRecord
from art_proxy_trainer.advantages import group_advantages
from art_proxy_trainer.batch import TrainingBatch, TrajectorySample, build_batch
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.scoring import token_logprobs
from art_proxy_trainer.step import train_step

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


# ---------------------------------------------------------------- the arms


def raw_step(model: PeftModel, optimizer: torch.optim.Optimizer, batch: TrainingBatch) -> None:
    """The baseline: forward, a plain policy-gradient loss, backward, AdamW; nothing else."""
    model.eval()  # as train_step: no dropout
    optimizer.zero_grad(set_to_none=True)
    logits_B_T_V = model(input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T).logits
    logprobs_B_Tm1_V = torch.log_softmax(logits_B_T_V[:, :-1], dim=-1)
    logprobs_B_Tm1 = logprobs_B_Tm1_V.gather(-1, batch.tokens_B_T[:, 1:, None]).squeeze(-1)
    mask_B_Tm1 = batch.mask_B_T[:, 1:]
    weighted_B_Tm1 = logprobs_B_Tm1 * batch.advantages_B[:, None] * mask_B_Tm1
    loss = -weighted_B_Tm1.sum() / mask_B_Tm1.sum()
    torch.autograd.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def no_grad_forward(model: PeftModel, batch: TrainingBatch) -> None:
    with torch.no_grad():
        model(input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T)


def arms(model: PeftModel, batch: TrainingBatch) -> list[Arm]:
    config = TrainerConfig()
    with_kl = TrainerConfig(kl_coef=KL_COEF)
    # One AdamW per arm, made as the trainer makes it; they all move the same adapter.
    raw_optimizer = make_optimizer(model, config)
    step_optimizer = make_optimizer(model, config)
    kl_optimizer = make_optimizer(model, with_kl)

    def step(optimizer: torch.optim.Optimizer, step_config: TrainerConfig) -> None:
        result = train_step(model, optimizer, batch, step_config)
        if not result.applied:
            raise RuntimeError(f"train_step abandoned the step: {result.reason}")

    return [
        Arm(RAW, lambda: raw_step(model, raw_optimizer, batch)),
        Arm(STEP, lambda: step(step_optimizer, config)),
        Arm(STEP_KL, lambda: step(kl_optimizer, with_kl)),
        Arm(FORWARD, lambda: no_grad_forward(model, batch)),
    ]


def measure(timed: list[Arm], sizes: Sizes) -> dict[str, list[float]]:
    """Seconds per arm and round. The arms take turns, each round starting one arm later, so
    that a burst from another process, or a cost paid by whichever arm opens a round, falls on
    every arm alike."""
    for arm in timed if sizes.warm_up else []:  # allocator, kernels, AdamW state
        arm.run()
    seconds: dict[str, list[float]] = {arm.name: [] for arm in timed}
    repeats = sizes.repeats
    for round_number in range(1, repeats + 1):
        shift = (round_number - 1) % len(timed)
        for arm in timed[shift:] + timed[:shift]:
            start = time.perf_counter()
            arm.run()
            seconds[arm.name].append(time.perf_counter() - start)
        console.print(
            f"  round {round_number}/{repeats}: "
            + ", ".join(f"{name} {times[-1] * 1000:.0f} ms" for name, times in seconds.items()),
            soft_wrap=True,
        )
    return seconds


def run(sizes: Sizes) -> Report:
    console.print("loading the bundled model ...")
    loaded = load_model(None)
    model = lora_model(loaded.model, TrainerConfig())
    console.print(
        f"sampling {sizes.group} completions of <= {sizes.completion_tokens} tokens "
        f"to a prompt of >= {sizes.prompt_tokens} tokens ..."
    )
    batch = grpo_batch(loaded, model, sizes)
    load_before = os.getloadavg()[0]
    seconds = measure(arms(model, batch), sizes)
    return Report(sizes, batch, seconds, load_before, os.getloadavg()[0])


# ---------------------------------------------------------------- report


def print_report(report: Report) -> None:
    batch = report.batch
    rows, length = batch.tokens_B_T.shape
    real_tokens = int(batch.attention_mask_B_T.sum())
    title = (
        f"one GRPO step, SmolLM2-135M + LoRA r={TrainerConfig().lora_rank}: {rows} rows x "
        f"{length} positions ({real_tokens} real tokens, {batch.trained_tokens} sampled); "
        f"median of {report.sizes.repeats}; {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads, load avg {report.load_before:.2f} -> "
        f"{report.load_after:.2f}"
    )
    table = Table(title=title)
    for column in ("what runs", "median ms", "best ms", "worst ms", "vs raw", "best vs best"):
        table.add_column(column, justify="right")
    for name, seconds in report.seconds.items():
        table.add_row(
            name,
            f"{report.median(name) * 1000:.0f}",
            f"{report.best(name) * 1000:.0f}",
            f"{max(seconds) * 1000:.0f}",
            f"{report.median_ratio(name):.3f}x",
            f"{report.best_ratio(name):.3f}x",
        )
    console.print(table)
    ratio, kl_ratio = report.median_ratio(STEP), report.median_ratio(STEP_KL)
    verdict = "[green]PASS[/green]" if ratio <= MAX_STEP_VS_RAW else "[red]MISS[/red]"
    console.print(
        f"{verdict} train_step vs raw, medians: {ratio:.2f}x (target <= {MAX_STEP_VS_RAW:g}x); "
        f"best rounds: {report.best_ratio(STEP):.2f}x. With kl_coef {KL_COEF:g}: "
        f"{kl_ratio:.2f}x, best {report.best_ratio(STEP_KL):.2f}x (info: one more forward)"
    )
    console.print(  # the key figure, last
        f"train_step = {ratio:.2f}x raw peft forward+backward "
        f"(target <= {MAX_STEP_VS_RAW:g}x; {kl_ratio:.2f}x with the KL term)"
    )


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> tuple[Sizes, int, int]:
    """The sizes, the torch threads to set (0: leave torch's default) and the ranks."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--group", type=int, default=8, help="trajectories (default: 8)")
    parser.add_argument(
        "--prompt-tokens", type=int, default=120, help="shared prompt, at least (default: 120)"
    )
    parser.add_argument(
        "--completion-tokens", type=int, default=32, help="sampled, at most (default: 32)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default: 5)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (default: 0, torch's own default, one per core); 1 keeps the "
        "figures steady when another process keeps the cores busy",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {QUICK.group} rows, a prompt of the template's length, "
        f"{QUICK.completion_tokens} tokens, {QUICK.repeats} round, no warm-up",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks: above 1, the step on that many ranks against one process (trainer_ranks.py)",
    )
    args = parser.parse_args(argv)
    if args.nproc < 1:
        parser.error("--nproc must be at least 1")
    if args.threads < 0:
        parser.error("--threads must be 0 (torch's default) or more")
    if args.quick:
        return QUICK, args.threads, args.nproc
    if min(args.group, args.prompt_tokens, args.completion_tokens, args.repeats) < 1:
        parser.error("every size must be at least 1")
    sizes = Sizes(args.group, args.prompt_tokens, args.completion_tokens, args.repeats)
    return sizes, args.threads, args.nproc


def main(argv: Sequence[str] | None = None) -> None:
    sizes, threads, nproc = parse_args(argv)
    if threads:
        torch.set_num_threads(threads)
    # peft wrapping the model calls an API transformers 5 deprecates: noise in the report.
    warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
    if nproc > 1:
        sys.path.insert(0, str(REPO))  # run as a script, the repository root is not on the path
        from benchmarks.trainer_ranks import run as run_ranks

        loaded = load_model(None)
        run_ranks(
            nproc,
            sizes.repeats,
            grpo_batch(loaded, lora_model(loaded.model, TrainerConfig()), sizes),
        )
        return
    print_report(run(sizes))


if __name__ == "__main__":
    main()
