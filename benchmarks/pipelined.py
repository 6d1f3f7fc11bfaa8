"""Does overlapping rollouts with training (`--max-off-policy-steps K`) save wall time, and learn
as well? The whole loop, alternating (K = 0) and overlapped (K = 1, 2, 4), side by side.

The single-word task of `learning_curve.py` through `art-proxy up` (local-llm, SmolLM2-135M), each
arm a fresh stack, the same seeds in every arm. Real agents wait on their tools and APIs: each
rollout here first waits `--tool-s` seconds (a tool that answers after 1.5 s by default; 0 for
the CPU-bound case, where the model, the trainer and the proxy share the cores). Per arm and seed
it prints the seconds to the first step whose training rollouts reach `--target` and the last
validation reward; last, per K, the mean seconds to the target as a ratio of K = 0's (the same
seeds) and the final validation reward with its 95% interval over seeds.

    .venv/bin/python benchmarks/pipelined.py                       # K = 0, 1, 2, 4; 3 seeds
    .venv/bin/python benchmarks/pipelined.py --tool-s 0            # CPU-bound
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
_TOOL_S = "ART_PIPELINED_TOOL_S"  # the rollouts' tool wait, handed to the agent by environment
# Student's t at 0.975 by degrees of freedom: a 95% interval over a few seeds.
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


async def rollout(run: Rollout) -> float:
    """The single-word agent behind a tool that answers after `--tool-s` seconds."""
    sys.path.insert(0, str(ROOT))
    from examples.single_word.agent import rollout as single_word

    await asyncio.sleep(float(os.environ.get(_TOOL_S, "0")))
    return await single_word(run)


@dataclass(frozen=True)
class Result:
    k: int
    seed: int
    seconds_to_target: float | None
    last_val: float | None
    seconds_total: float
    step_seconds: float  # of seconds_total, the trainer's in steps

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
    results: list[Result] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for k in args.ks:
            arm = Arm(
                "local",
                max_off_policy_steps=k,
                agent=f"{Path(__file__).resolve()}:rollout",
                seed=seed,
            )
            run = run_engine(arm, args)
            vals = [row.val for row in run.rows if row.val is not None]
            total = run.rows[-1].seconds if run.rows else math.nan
            results.append(
                Result(
                    k,
                    seed,
                    None if run.reached is None else run.reached[1],
                    vals[-1] if vals else None,
                    total,
                    run.step_seconds,
                )
            )
            console.print(f"K={k} seed {seed}: {results[-1]}")
    console.print(_table(results, args))
    console.print(_figures(results, args))  # the key figures, last


def _interval(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.2f}"
    half = _T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.2f} ± {half:.2f}"


def _reached(results: list[Result], k: int) -> list[float]:
    return [r.seconds_to_target for r in results if r.k == k and r.seconds_to_target is not None]


def _table(results: list[Result], args: argparse.Namespace) -> Table:
    table = Table(
        title=f"whole loop, single-word task, tool {args.tool_s:g} s a rollout, {args.steps} steps"
    )
    columns = ("K", "seeds at target", "s to target", "x K=0", "last val (95%)", "s total")
    for column in (*columns, "trainer busy"):
        table.add_column(column, justify="right")
    sync = _reached(results, 0)
    for k in args.ks:
        reached = _reached(results, k)
        ratio = statistics.fmean(reached) / statistics.fmean(sync) if reached and sync else math.nan
        mine = [r for r in results if r.k == k]
        table.add_row(
            str(k),
            f"{len(reached)} of {len(mine)}",
            _interval(reached),
            f"{ratio:.2f}",
            _interval([r.last_val for r in mine if r.last_val is not None]),
            _interval([r.seconds_total for r in mine]),
            _interval([r.trainer_busy for r in mine]),
        )
    return table


def _figures(results: list[Result], args: argparse.Namespace) -> str:
    sync = _reached(results, 0)
    parts = []
    for k in args.ks:
        reached = _reached(results, k)
        ratio = statistics.fmean(reached) / statistics.fmean(sync) if reached and sync else math.nan
        vals = [r.last_val for r in results if r.k == k and r.last_val is not None]
        wall = _mean_ratio(results, k, lambda r: r.seconds_total)
        busy = statistics.fmean([r.trainer_busy for r in results if r.k == k] or [math.nan])
        parts.append(
            f"K={k} {ratio:.2f}x to target, {wall:.2f}x all steps, val {_interval(vals)}, "
            f"trainer busy {busy:.0%}"
        )
    return f"wall time vs K=0 (train reward >= {args.target}): " + "; ".join(parts)


def _mean_ratio(results: list[Result], k: int, of: Callable[[Result], float]) -> float:
    mine = [of(r) for r in results if r.k == k]
    sync = [of(r) for r in results if r.k == 0]
    return statistics.fmean(mine) / statistics.fmean(sync) if mine and sync else math.nan


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ks", type=lambda text: [int(k) for k in text.split(",")], default=[0, 1, 2, 4]
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds run: from this one")
    parser.add_argument("--tool-s", type=float, default=1.5)
    sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path
    from benchmarks.learning_curve import add_run_arguments  # no torch: before share_cpu_cores

    add_run_arguments(parser)
    parsed = parser.parse_args()
    parsed.judge = False  # what learning_curve's runs read
    main(parsed)
