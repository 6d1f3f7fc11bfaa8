"""Peak memory of one trainer step: logits at trained positions in chunks, against full logits.

One subprocess per arm (so each peak is its own) loads the bundled SmolLM2-135M-Instruct in
float32, wraps it with the trainer's `lora_model` (default `TrainerConfig`: r 8, every linear
projection, micro-batch 8,192 tokens) and takes one `train_step` on a batch that fills the default
micro-batch: `--rows` sequences of `--prompt-tokens` prompt tokens and `--completion-tokens` sampled
ones (random ids: memory does not depend on the text).

- `full logits`: the model's own output layer, the whole vocabulary at every position of the
  micro-batch (what the trainer computed before), then the log-softmax and gather;
- `trained positions`: the trainer's output layer, float32 logits only at the positions whose next
  token is trained, in chunks recomputed in the backward.

It prints each arm's resident set before the step, its peak during the step (ru_maxrss), and last
the ratio of the step's peak increments.

    .venv/bin/python benchmarks/trainer_memory.py [--rows 16] [--prompt-tokens 448]
        [--completion-tokens 64] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
# Each arm's address space: three quarters of the machine's memory.
_LIMIT_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def _arm(
    full_logits: bool, recompute: bool, rows: int, prompt: int, completion: int
) -> dict[str, float]:
    import torch

    from art_proxy.config import TrainerConfig
    from art_proxy.local.model_loading import load_model
    from art_proxy_trainer.batch import SequenceStats, TrainingBatch
    from art_proxy_trainer.lora import lora_model, make_optimizer
    from art_proxy_trainer.scoring import has_sampled_head
    from art_proxy_trainer.step import train_step

    warnings.filterwarnings("ignore")
    # Past this address space an allocation fails in this process alone, where the kernel's
    # out-of-memory killer might pick another process of the machine.
    resource.setrlimit(resource.RLIMIT_AS, (_LIMIT_BYTES, _LIMIT_BYTES))
    torch.manual_seed(0)
    config = TrainerConfig(gradient_checkpointing=recompute)
    loaded = load_model(None)
    model = lora_model(loaded.model, config)
    if full_logits:
        head = getattr(model.get_base_model(), "lm_head")  # noqa: B009  # a module, not typed as one
        del head.forward  # the class's own forward again
    assert has_sampled_head(model) is not full_logits
    optimizer = make_optimizer(model, config)
    length = prompt + completion
    vocabulary = int(loaded.model.config.vocab_size)
    tokens_B_T = torch.randint(0, vocabulary, (rows, length))
    mask_B_T = torch.zeros(rows, length)
    mask_B_T[:, prompt:] = 1.0
    batch = TrainingBatch(
        tokens_B_T,
        torch.ones(rows, length, dtype=torch.int64),
        mask_B_T,
        torch.full((rows, length), -3.0) * mask_B_T,
        torch.linspace(-1.0, 1.0, rows),
        SequenceStats(rows),
    )
    before = _rss_mib()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    try:
        result = train_step(model, optimizer, batch, config)
    except (RuntimeError, MemoryError) as exc:  # torch's CPU allocator: "can't allocate memory"
        if "allocate" not in str(exc) and not isinstance(exc, MemoryError):
            raise
        return {"out_of_memory": 1.0}
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "before_mib": before,
        "peak_mib": max(peak, peak_before),
        "step_peak_mib": peak - before if peak > peak_before else 0.0,
        "applied": float(result.applied),
        "seconds": seconds,
        "tokens": float(rows * length),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=448)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="a small batch: a smoke run")
    parser.add_argument("--arm", choices=sorted(ARMS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.prompt_tokens, args.completion_tokens = 2, 24, 8
    sizes = (args.rows, args.prompt_tokens, args.completion_tokens)
    if args.arm is not None:
        print(json.dumps(_arm(*ARMS[args.arm][1:], *sizes)))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    results: dict[str, dict[str, float] | None] = {}
    for arm in ARMS:
        command = [sys.executable, __file__, "--arm", arm]
        command += ["--rows", str(args.rows), "--prompt-tokens", str(args.prompt_tokens)]
        command += ["--completion-tokens", str(args.completion_tokens)]
        out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise SystemExit(f"{arm}: {out.stderr.strip().splitlines()[-1]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        results[arm] = None if "out_of_memory" in row else row
    total_mib = _LIMIT_BYTES / 2**20
    table = Table(
        title=f"one trainer step, {args.rows} x {args.prompt_tokens + args.completion_tokens} "
        f"tokens ({args.completion_tokens} trained a row), SmolLM2-135M float32, CPU"
    )
    for column in ("arm", "RSS before", "peak RSS", "step's increment", "step s"):
        table.add_column(column)
    for arm, row in results.items():
        if row is None:
            table.add_row(ARMS[arm][0], "", f"out of memory: > {total_mib:.0f} MiB", "", "")
            continue
        table.add_row(
            ARMS[arm][0],
            f"{row['before_mib']:.0f} MiB",
            f"{row['peak_mib']:.0f} MiB",
            f"{row['step_peak_mib']:.0f} MiB",
            f"{row['seconds']:.1f}",
        )
    console.print(table)
    before, after = results["full"], results["default"]
    assert after is not None
    if before is None:
        console.print(
            f"peak RSS of the default step: {after['peak_mib']:.0f} MiB against more than "
            f"{total_mib:.0f} MiB with full logits (out of memory): "
            f"< {after['peak_mib'] / total_mib:.2f}x (target <= 0.5)",
            soft_wrap=True,  # the figure is one line, whatever the terminal's width
        )
    else:
        console.print(
            f"peak RSS of the default step: {after['peak_mib'] / before['peak_mib']:.2f}x of full "
            "logits (target <= 0.5)",
            soft_wrap=True,
        )


# name -> (label, full logits, recomputed activations)
ARMS = {
    "full": ("full logits, activations kept (before)", True, False),
    "trained": ("trained positions, activations kept", False, False),
    "default": ("trained positions, activations recomputed", False, True),
}


if __name__ == "__main__":
    main()
