"""Does overlapping rollouts with training (`--max-off-policy-steps K`) save wall time, and learn
as well? The whole loop, alternating (K = 0) and overlapped (K = 1, 2, 4), side by side.

The single-word task of `learning_curve.py` through `art-proxy up` (local-llm, SmolLM2-135M), each
arm a fresh stack, the same seeds in every arm. Real agents wait on their tools and APIs. The
default agent (`--agent two-call`) makes two calls a rollout: it answers, waits `--tool-s`
seconds on a tool (1.5 s), answers again in the same conversation, and waits `--after-s` (0.75 s)
before it returns the mean of its two answers' rewards; `--agent one-call` waits `--tool-s`, then
answers once (`--tool-s 0`: the CPU-bound case, where the model, the trainer and the proxy share
the cores). Validation runs every `--val-every` steps. Per arm and seed it prints the whole run's
wall time (from its first rollout to its last step), the seconds to the first step whose
training rollouts reach `--target`, the last validation reward and how long the trainer waited
for its batch on validated steps and on the others; last, per K, the whole run's time as a ratio
of K = 0's (the same seeds) and the final validation reward with its 95% interval over seeds.

    .venv/bin/python benchmarks/pipelined.py --ks 0,1 --steps 12 --val-every 4   # 3 seeds
    .venv/bin/python benchmarks/pipelined.py --agent one-call --tool-s 0           # CPU-bound
    .venv/bin/python benchmarks/pipelined.py --ks 0,1 --seeds 1 --steps 2   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from art_proxy.rollout import Rollout

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path

from benchmarks.learning_curve_summary import seed_interval  # noqa: E402  # after the path above

_TOOL_S = "ART_PIPELINED_TOOL_S"  # the rollouts' tool wait, handed to the agent by environment
_AFTER_S = "ART_PIPELINED_AFTER_S"  # the two-call agent's wait after its second answer


async def rollout(run: Rollout) -> float:
    """The single-word agent behind a tool that answers after `--tool-s` seconds."""
    sys.path.insert(0, str(ROOT))
    from examples.single_word.agent import rollout as single_word

    await asyncio.sleep(float(os.environ.get(_TOOL_S, "0")))
    return await single_word(run)


async def two_calls(run: Rollout) -> float:
    """Two answers in one conversation with a tool's wait between them and a wait after: the
    mean of their single-word rewards."""
    sys.path.insert(0, str(ROOT))
    from examples.single_word.agent import MAX_TOKENS, SYSTEM, rate

    messages: list[dict[str, str]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": str(run.scenario.input)},
    ]
    rewards = []
    async with run.openai_client() as client:
        for turn in range(2):
            reply = await client.chat.completions.create(
                model=run.model,
                messages=messages,  # type: ignore[arg-type]  # plain dicts, as agents send them
                max_tokens=MAX_TOKENS,
                temperature=1.0,
            )
            choice = reply.choices[0]
            rewards.append(rate(choice.message.content, choice.finish_reason))
            if turn == 0:
                await asyncio.sleep(float(os.environ.get(_TOOL_S, "0")))  # the tool answers
                messages += [
                    {"role": "assistant", "content": choice.message.content or ""},
                    {"role": "user", "content": "The tool noted it. Another one?"},
                ]
    await asyncio.sleep(float(os.environ.get(_AFTER_S, "0")))
    return statistics.fmean(rewards)


@dataclass(frozen=True)
class Result:
    k: int
    seed: int
    seconds_to_target: float | None
    last_val: float | None
    seconds_total: float  # from the run's first rollout to its last step
    step_seconds: float  # of seconds_total, the trainer's in steps
    wait_validated: float  # the trainer's mean wait for its batch on validated steps (K > 0)
    wait_other: float  # ... and on the others

    @property
    def trainer_busy(self) -> float:
        """The fraction of the run the trainer spent in steps: near 1, the trainer bounds the
        loop and overlap can hide nothing more."""
        return self.step_seconds / self.seconds_total if self.seconds_total else math.nan


def main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from art_proxy.cpu_sharing import share_cpu_cores

    share_cpu_cores()  # before torch loads
    from benchmarks.learning_curve import run_engine
    from benchmarks.learning_curve_summary import Arm, console

    os.environ[_TOOL_S] = str(args.tool_s)
    os.environ[_AFTER_S] = str(args.after_s)
    agent = "two_calls" if args.agent == "two-call" else "rollout"
    results: list[Result] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for k in args.ks:
            arm = Arm(
                "local",
                max_off_policy_steps=k,
                agent=f"{Path(__file__).resolve()}:{agent}",
                seed=seed,
            )
            run = run_engine(arm, args)
            vals = [row.val for row in run.rows if row.val is not None]
            total = run.rows[-1].seconds - run.first_rollout_s if run.rows else math.nan
            validated = [w for s, w in run.trainer_waits.items() if s % args.val_every == 0]
            other = [w for s, w in run.trainer_waits.items() if s % args.val_every != 0]
            results.append(
                Result(
                    k,
                    seed,
                    None if run.reached is None else run.reached[1] - run.first_rollout_s,
                    vals[-1] if vals else None,
                    total,
                    run.step_seconds,
                    statistics.fmean(validated) if validated else math.nan,
                    statistics.fmean(other) if other else math.nan,
                )
            )
            console.print(f"K={k} seed {seed}: {results[-1]}")
    console.print(_table(results, args))
    console.print(_figures(results, args))  # the key figures, last


def _reached(results: list[Result], k: int) -> list[float]:
    return [r.seconds_to_target for r in results if r.k == k and r.seconds_to_target is not None]


def _table(results: list[Result], args: argparse.Namespace) -> Table:
    table = Table(
        title=f"whole loop, single-word task, {args.agent} agent, tool {args.tool_s:g} s, "
        f"{args.steps} steps, validation every {args.val_every}"
    )
    columns = ("K", "s all steps", "x K=0", "last val (95%)", "seeds at target", "s to target")
    for column in (*columns, "wait s: validated / other", "trainer busy"):
        table.add_column(column, justify="right")
    for k in args.ks:
        mine = [r for r in results if r.k == k]
        reached = _reached(results, k)
        waits = "-"
        if k:
            validated = [r.wait_validated for r in mine if not math.isnan(r.wait_validated)]
            other = [r.wait_other for r in mine if not math.isnan(r.wait_other)]
            waits = f"{seed_interval(validated)} / {seed_interval(other)}"
        table.add_row(
            str(k),
            seed_interval([r.seconds_total for r in mine]),
            f"{_mean_ratio(results, k, lambda r: r.seconds_total):.2f}",
            seed_interval([r.last_val for r in mine if r.last_val is not None]),
            f"{len(reached)} of {len(mine)}",
            seed_interval(reached),
            waits,
            seed_interval([r.trainer_busy for r in mine]),
        )
    return table


def _figures(results: list[Result], args: argparse.Namespace) -> str:
    parts = []
    sync_vals = [r.last_val for r in results if r.k == 0 and r.last_val is not None]
    for k in args.ks:
        vals = [r.last_val for r in results if r.k == k and r.last_val is not None]
        wall = _mean_ratio(results, k, lambda r: r.seconds_total)
        gap = statistics.fmean(vals) - statistics.fmean(sync_vals) if vals and sync_vals else 0
        parts.append(f"K={k} {wall:.2f}x, val {seed_interval(vals)} ({gap:+.2f})")
    return f"whole run's wall time vs K=0, {args.steps} steps: " + "; ".join(parts)


def _mean_ratio(results: list[Result], k: int, of: Callable[[Result], float]) -> float:
    mine = [of(r) for r in results if r.k == k]
    sync = [of(r) for r in results if r.k == 0]
    return statistics.fmean(mine) / statistics.fmean(sync) if mine and sync else math.nan


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=lambda text: [int(k) for k in text.split(",")], default=[0, 1])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds run: from this one")
    parser.add_argument("--agent", choices=["two-call", "one-call"], default="two-call")
    parser.add_argument("--tool-s", type=float, default=1.5)
    parser.add_argument("--after-s", type=float, default=0.75)
    sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path
    from benchmarks.learning_curve import add_run_arguments  # no torch: before share_cpu_cores

    add_run_arguments(parser)
    parsed = parser.parse_args()
    parsed.judge = False  # what learning_curve's runs read
    main(parsed)
