"""`learning_curve.py`'s records and summary: an arm (engine, dtype, objective), each engine run's
step rows, and the one-screen summary that ends the run, its key figure last."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from benchmarks.grpo_peers import PeerResult

console = Console()
# Student's t at 0.975 by degrees of freedom: a 95% interval over a few seeds.
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def seed_interval(values: list[float]) -> str:
    """The mean of `values` (one per seed) with its 95% interval's half width (Student's t)."""
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.2f}"
    half = _T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.2f} ± {half:.2f}"


@dataclass(frozen=True)
class Arm:
    """One run of the stack: the engine, vLLM's dtype and the trainer's objective."""

    engine: str
    vllm_dtype: str = "auto"
    objective: str = "tis"
    strict: bool = False  # reward 1 for exactly one word, else 0 (agent.py:rollout_strict)
    guided: bool = False  # train --guided-retries --guide agent.HINT
    max_off_policy_steps: int = 0  # train --max-off-policy-steps (benchmarks/pipelined.py)
    agent: str | None = None  # another rollout function (FILE:FUNCTION) on the same task
    seed: int | None = None  # train --seed (None: its default)
    # On-policy distillation (benchmarks/distill.py): the served model as its own teacher, shown
    # this text (train --teacher-context), with the group advantage or without it.
    teacher_context: str | None = None
    # Or a trained adapter's directory, served beside the base as the teacher (train --teacher).
    teacher_adapter: Path | None = None
    group_advantage: bool = True
    name: str | None = None  # the arm's label, where the fields above do not make it

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        if self.strict:
            return f"{self.engine}, strict, " + ("guided retries" if self.guided else "no retries")
        overlap = f", overlapped K={self.max_off_policy_steps}" if self.max_off_policy_steps else ""
        if self.engine != "vllm" or self.vllm_dtype == "auto":
            return self.engine + overlap
        return f"vllm {self.vllm_dtype}, {self.objective}{overlap}"


@dataclass
class EngineRun:
    engine: str
    rows: list[StepRow]
    reached: tuple[int, float] | None  # (step, seconds) of the first task reward >= target
    best: float
    guided_retries: float = 0.0  # all-fail groups run again guided, over the run
    guided_rescued: float = 0.0  # of those, the ones whose retry had a reward spread
    step_seconds: float = 0.0  # the trainer's seconds in steps, over the run (seconds_step)
    # Seconds from the start of `run_train` to the run's first rollout: the model's load, which
    # the run's own wall time leaves out.
    first_rollout_s: float = 0.0
    trainer_waits: dict[int, float] = field(default_factory=dict)  # step -> waited for its batch
    adapter: Path | None = None  # the newest checkpoint's adapter (a later arm's teacher)


@dataclass(frozen=True)
class StepRow:
    step: int
    train: float
    task: float
    val: float | None
    clip: float
    ratio: float
    mismatch: float  # mean |log pi_trainer - log pi_sampler| of the step's tokens
    seconds: float
    teacher_kl: float | None = None  # with a teacher: the sampled tokens' reverse KL from it


def step_table(engine: str, rows: list[StepRow]) -> Table:
    table = Table(title=f"learning curve through {engine}: SmolLM2-135M, single-word task, CPU")
    columns = ("step", "train reward", "task reward", "val reward", "clip", "ratio", "|dlogp|")
    for column in (*columns, "s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row.step),
            f"{row.train:.3f}",
            f"{row.task:.3f}",
            "-" if row.val is None else f"{row.val:.3f}",
            f"{row.clip:.3f}",
            f"{row.ratio:.3f}",
            f"{row.mismatch:.3f}",
            f"{row.seconds:.0f}",
        )
    return table


def summarize(runs: list[EngineRun], peers: list[PeerResult], target: float) -> None:
    table = Table(title=f"to the first training-step task reward >= {target}")
    columns = ("how", "steps", "seconds", "best task reward", "last val", "max clip", "|dlogp|")
    for column in columns:
        table.add_column(column, justify="right")
    figures = []
    for run in runs:
        step, seconds = run.reached or (None, None)
        # A step with no trained token (every group without signal) has neither.
        clips = [row.clip for row in run.rows if not math.isnan(row.clip)]
        mismatches = [row.mismatch for row in run.rows if not math.isnan(row.mismatch)]
        vals = [row.val for row in run.rows if row.val is not None]
        table.add_row(
            f"art-proxy stack, {run.engine}",
            "-" if step is None else str(step),
            "-" if seconds is None else f"{seconds:.0f}",
            f"{run.best:.3f}",
            f"{vals[-1]:.3f}" if vals else "-",
            f"{max(clips, default=math.nan):.3f}",
            f"{math.fsum(mismatches) / len(mismatches):.3f}" if mismatches else "-",
        )
        figures.append(f"{run.engine} {_reached(run.reached)}")
    for peer in peers:
        table.add_row(
            peer.name,
            "-" if peer.reached is None else str(peer.reached[0]),
            "-" if peer.reached is None else f"{peer.reached[1]:.0f}",
            f"{peer.best:.3f}",
            "-",
            "-",
            "-",
        )
        figures.append(f"{peer.name} {_reached(peer.reached)}")
    console.print(table)
    console.print(f"task reward >= {target}: " + "; ".join(figures))  # the key figures, last


def summarize_guided(runs: list[EngineRun], target: float) -> None:
    """Validation (never guided) by step, the first step it reaches `target`, and the all-fail
    groups each run retried with guidance and rescued (a retry with a reward spread)."""
    table = Table(title=f"strict single-word task: to a validation reward >= {target}")
    for column in ("run", "validation by step", "first step >= target", "retried", "rescued"):
        table.add_column(column, justify="right")
    figures = []
    for run in runs:
        vals = [(row.step, row.val) for row in run.rows if row.val is not None]
        first = next((step for step, val in vals if val >= target), None)
        table.add_row(
            run.engine,
            ", ".join(f"{step}: {val:.2f}" for step, val in vals),
            "-" if first is None else str(first),
            f"{run.guided_retries:.0f}",
            f"{run.guided_rescued:.0f}",
        )
        reached = "not reached" if first is None else f"step {first}"
        figures.append(f"{run.engine} {reached} (last {vals[-1][1]:.2f})" if vals else run.engine)
    console.print(table)
    console.print(f"validation >= {target}: " + "; ".join(figures))  # the key figures, last


def _reached(reached: tuple[int, float] | None) -> str:
    return "not reached" if reached is None else f"step {reached[0]}, {reached[1]:.0f} s"
