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
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from peft import PeftModel
from rich.table import Table

from art_proxy.config import TrainerConfig
from art_proxy.local.model_loading import load_model
from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.step import train_step

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.trainer_ranks import MEMORY_MODEL, QUICK_MEMORY_MODEL
from benchmarks.trainer_step_batch import (
    FORWARD,
    KL_COEF,
    MAX_STEP_VS_RAW,
    QUICK,
    RAW,
    REPO,
    STEP,
    STEP_KL,
    Arm,
    Report,
    Sizes,
    console,
    grpo_batch,
)

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
        f"{QUICK.completion_tokens} tokens, {QUICK.repeats} round, no warm-up; with --nproc, "
        f"a {QUICK_MEMORY_MODEL.name} for the memory figures",
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
            QUICK_MEMORY_MODEL if sizes is QUICK else MEMORY_MODEL,  # --quick
        )
        return
    print_report(run(sizes))


if __name__ == "__main__":
    main()
