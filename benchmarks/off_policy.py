"""Does the trainer learn from data its own weights did not sample? Stale batches against fresh ones.

Production traffic is served by an adapter several steps old (before the first promotion, by the base
model), so the tokens the trainer reads were sampled by other weights than those it trains. This
runs the trainer's own step (`train_step`, the project's loss, scoring and optimiser) on the task
of `examples/single_word/` (answer with one word; reward 1/words, 0 when cut off) with the bundled
SmolLM2-135M in float32, LoRA r 8, lr 2e-4, 2 groups of 8 samples a step at temperature 1:

- `fresh`: every batch sampled by the adapter being trained (the on-policy reference);
- `stale/<objective>`: every batch sampled by the base model (the adapter switched off), as
  production is before the first promotion, trained with each `--objective`.

Each sample's recorded logprob is the sampler's own (mu), as the proxy records it. After the last
step, each arm's policy answers the held-out questions (the example's `val` split, `--eval`
samples each) and its mean reward is the figure; a 95% interval over `--seeds` seeds is printed
beside it, and last the gap of each stale arm to the fresh one.

    .venv/bin/python benchmarks/off_policy.py [--steps 12] [--seeds 3] [--eval 16] [--quick]
        [--arms fresh:tis,stale:ppo,stale:tis,stale:mis,stale:tis:8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from art_proxy.config import TrainerConfig
from art_proxy.local.model_loading import LoadedModel, load_model
from art_proxy_trainer.advantages import group_advantages
from art_proxy_trainer.batch import TrajectorySample, build_batch
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.loss import Objective
from art_proxy_trainer.step import train_step
from benchmarks.grpo_peers import EXAMPLE, _task, sample_with_logprobs
from benchmarks.trainer_step_batch import recorded_call

console = Console()


@dataclass(frozen=True)
class Arm:
    name: str
    stale: bool  # sampled by the base model, not the adapter being trained
    objective: Objective
    is_cap: float = 2.0
    scale_by_std: bool = False  # --scale-advantages-by-std
    updates: int = 1  # --updates-per-batch

    @classmethod
    def parse(cls, spec: str) -> Arm:
        """`fresh:tis`, `stale:mis:5`, `stale:tis:2:std:u2`: who samples, the objective, its
        --is-cap, `std` for --scale-advantages-by-std, `uN` for --updates-per-batch N."""
        who, objective, *rest = spec.split(":")
        scale_by_std = "std" in rest
        updates = next((int(r[1:]) for r in rest if r[:1] == "u" and r[1:].isdigit()), 1)
        cap = [r for r in rest if r != "std" and not (r[:1] == "u" and r[1:].isdigit())]
        if who not in ("fresh", "stale") or objective not in ("tis", "mis", "ppo") or len(cap) > 1:
            raise SystemExit(f"--arms {spec}: expected fresh|stale:tis|mis|ppo[:cap][:std][:uN]")
        is_cap = float(cap[0]) if cap else 2.0
        suffix = (
            (f" cap {is_cap:g}" if cap else "")
            + (" std" if scale_by_std else "")
            + (f" x{updates}" if updates > 1 else "")
        )
        return cls(
            f"{who} {objective}{suffix}",
            who == "stale",
            objective,  # type: ignore[arg-type]  # checked above
            is_cap,
            scale_by_std,
            updates,
        )


@dataclass
class ArmResult:
    arm: Arm
    rewards: list[float]  # held-out reward after the last step, one per seed
    train_rewards: list[list[float]]  # per seed, each step's mean sample reward
    ratios: list[float]  # mean pi_prox/mu of each step (every seed)
    capped: list[float]  # share of tokens truncated / masked / clipped of each step
    seconds: float


def _split() -> tuple[list[str], list[str]]:
    """(train questions, held-out questions) by the example's splits."""
    train: list[str] = []
    held_out: list[str] = []
    for line in (EXAMPLE / "scenarios.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            (held_out if row.get("split") == "val" else train).append(str(row["input"]))
    return train, held_out


def _prompt(loaded: LoadedModel, system: str, question: str) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    text = loaded.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    return list(loaded.tokenizer(str(text), add_special_tokens=False)["input_ids"])


def _sample(
    model: PeftModel, prompt: list[int], n: int, eos: int, base: bool
) -> list[tuple[list[int], list[float], str]]:
    """`n` completions at temperature 1 with each token's logprob under the sampler (mu)."""
    with model.disable_adapter() if base else contextlib.nullcontext():
        return sample_with_logprobs(model, prompt, n, eos)


def run_arm(
    arm: Arm, seed: int, steps: int, evals: int, loaded_base: Callable[[], LoadedModel]
) -> tuple[float, list[float], list[float], list[float]]:
    system, _, rate = _task()
    train, held_out = _split()
    loaded = loaded_base()
    torch.manual_seed(seed)
    config = TrainerConfig(
        objective=arm.objective, is_cap=arm.is_cap, updates_per_batch=arm.updates
    )
    model = lora_model(loaded.model, config)
    optimizer = make_optimizer(model, config)
    eos = int(loaded.tokenizer.eos_token_id)
    order = random.Random(seed).sample(train, len(train))
    rewards_by_step: list[float] = []
    ratios: list[float] = []
    capped: list[float] = []
    for step in range(steps):
        samples: list[TrajectorySample] = []
        rewards: list[float] = []
        for g in range(2):
            question = order[(2 * step + g) % len(order)]
            prompt = _prompt(loaded, system, question)
            drawn = _sample(model, prompt, 8, eos, base=arm.stale)
            group = {
                f"s{step}g{g}r{i}": rate(
                    str(loaded.tokenizer.decode(ids, skip_special_tokens=True)), f
                )
                for i, (ids, _, f) in enumerate(drawn)
            }
            rewards += group.values()
            advantages = group_advantages({"g": group}, scale_by_std=arm.scale_by_std).by_trajectory
            samples += [
                TrajectorySample(t, [recorded_call(t, prompt, ids, lp)], advantages[t])
                for t, (ids, lp, _) in zip(group, drawn, strict=True)
                if t in advantages  # a group with no reward spread carries no signal
            ]
        rewards_by_step.append(statistics.fmean(rewards))
        if not samples:  # neither group had a reward spread: the trainer skips such a step
            continue
        batch = build_batch(samples, pad_token_id=eos)
        result = train_step(model, optimizer, batch, config)
        if result.metrics is not None:
            ratios.append(result.metrics.mean_ratio)
            capped.append(
                result.metrics.clip_fraction if arm.objective == "ppo" else result.metrics.is_capped
            )
    held = []
    for question in held_out:
        drawn = _sample(model, _prompt(loaded, system, question), evals, eos, base=False)
        held += [
            rate(str(loaded.tokenizer.decode(ids, skip_special_tokens=True)), f)
            for ids, _, f in drawn
        ]
    return statistics.fmean(held), rewards_by_step, ratios, capped


def interval(values: Sequence[float]) -> str:
    """mean ± the half-width of a t-based 95% interval over seeds."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.2f}"
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78}.get(len(values), 2.26)
    return f"{mean:.2f} ± {t * statistics.stdev(values) / math.sqrt(len(values)):.2f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval", type=int, default=16, help="samples per held-out question")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 step, 1 seed, 1 sample a held-out question: a smoke run",
    )
    parser.add_argument(
        "--arms",
        default="fresh:tis,stale:ppo,stale:tis,stale:mis",
        help="comma-separated who:objective[:is_cap][:std][:uN]; the first is the reference",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.eval = 1, 1, 1
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    arms = [Arm.parse(spec) for spec in args.arms.split(",")]
    results = []
    for arm in arms:
        started = time.monotonic()
        result = ArmResult(arm, [], [], [], [], 0.0)
        for seed in range(args.seeds):
            held, per_step, ratios, capped = run_arm(
                arm, seed, args.steps, args.eval, lambda: load_model(None)
            )
            result.rewards.append(held)
            result.train_rewards.append(per_step)
            result.ratios += ratios
            result.capped += capped
            console.print(
                f"{arm.name:12} seed {seed}: held-out {held:.2f}, training reward by step "
                + " ".join(f"{r:.2f}" for r in per_step)
            )
        result.seconds = time.monotonic() - started
        results.append(result)
    table = Table(title=f"held-out reward after {args.steps} steps ({args.seeds} seeds, 95% CI)")
    for column in ("arm", "held-out reward", "gap to fresh", "mean pi_prox/mu", "capped", "s"):
        table.add_column(column)
    fresh = statistics.fmean(results[0].rewards)
    for result in results:
        table.add_row(
            result.arm.name,
            interval(result.rewards),
            f"{statistics.fmean(result.rewards) - fresh:+.2f}",
            f"{statistics.fmean(result.ratios):.2f}" if result.ratios else "-",
            f"{statistics.fmean(result.capped):.1%}" if result.capped else "-",
            f"{result.seconds:.0f}",
        )
    console.print(table)
    if len(results) < 2:
        return  # no stale arm to set beside the reference
    best = max(results[1:], key=lambda r: statistics.fmean(r.rewards))
    gap = statistics.fmean(best.rewards) - fresh
    console.print(
        f"stale data, best objective {best.arm.objective}: {gap:+.2f} to fresh data "
        f"(target: within 0.10) -> {'PASS' if gap >= -0.10 else 'MISS'}",
        soft_wrap=True,  # the figure is one line, whatever the terminal's width
    )


if __name__ == "__main__":
    main()
