"""Does the loop learn? SmolLM2-135M on CPU through the whole stack, on a verifiable task.

agent -> proxy -> local-llm -> store -> reward -> trainer -> swap, exactly as `art-proxy up --agent`
runs it: the example agent of `examples/single_word/` (answer with one word; reward 1/words, 0 when
cut off) runs 8 rollouts on each of 2 scenarios a step, the trainer takes a GRPO step on a LoRA
adapter (r 8, lr 2e-4) and swaps it in, and the next rollouts are served by it. Prints the mean
training reward per step, the validation reward, and last the wall time to reach the target.

    .venv/bin/python benchmarks/learning_curve.py             # the programmatic reward
    .venv/bin/python benchmarks/learning_curve.py --judge     # SmolLM2 as a logprob RULER judge

With --judge the trainer learns from RULER's scores and the table also shows the programmatic
reward of the same rollouts (what the judge was meant to find).
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
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from art_proxy.config import TrainSettings
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.loopback import free_port
from art_proxy_trainer.command import run_train

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "single_word"
console = Console()


async def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the stack exited with status {process.returncode}")
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5)
    raise SystemExit(f"{url} was not healthy after {timeout_s:.0f} s")


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


def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="art-learning-"))
    port, llm_port = free_port(), free_port()
    store = f"sqlite:///{work / 'art.db'}"
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    # up's local-llm reads its --threads from the environment, as every flag can be.
    env = {**os.environ, "ART_PROXY_THREADS": str(args.threads)}
    with (work / "stack.log").open("wb") as log:
        stack = subprocess.Popen(
            [art_proxy, "up", "--port", str(port), "--llm-port", str(llm_port), "--store", store],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            asyncio.run(_train(args, work, stack, port, llm_port, store))
        finally:
            stack.terminate()
            stack.wait(timeout=30)


async def _train(
    args: argparse.Namespace,
    work: Path,
    stack: subprocess.Popen[bytes],
    port: int,
    llm_port: int,
    store: str,
) -> None:
    proxy = f"http://127.0.0.1:{port}"
    llm = f"http://127.0.0.1:{llm_port}/v1"
    await _wait_healthy(f"{proxy}/health", stack, timeout_s=600)
    judge = {}
    if args.judge:
        judge = {
            "judge": ["openai/SmolLM2-135M-Instruct"],
            "judge_base_url": [llm],
            "judge_mode": "logprob",
        }
    settings = TrainSettings.model_validate(
        {
            "store": store,
            "proxy": proxy,
            "upstream": [llm],
            "out": str(work / "train"),
            "agent": f"{EXAMPLE / 'agent.py'}:rollout",
            "scenarios": str(EXAMPLE / "scenarios.jsonl"),
            "steps": args.steps,
            "group_size": args.group_size,
            "groups_per_step": args.groups_per_step,
            "concurrency": args.group_size * args.groups_per_step,
            "val_every": args.val_every,
            "learning_rate": args.learning_rate,
            "threads": args.threads,
            **judge,
        }
    )
    console.rule(f"training in {work}")
    started = datetime.now(UTC)
    summary = await run_train(settings, console)
    records = [
        json.loads(line) for line in (work / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    programmatic = await _programmatic_by_step(store, settings.run_name)
    table = Table(title="learning curve: SmolLM2-135M, single-word task, whole stack on CPU")
    for column in ("step", "train reward", "task reward", "val reward", "seconds"):
        table.add_column(column, justify="right")
    reached: tuple[int, float] | None = None
    for record in records:
        metrics = record["metrics"]
        elapsed = (datetime.fromisoformat(record["created_at"]) - started).total_seconds()
        task = programmatic.get(record["step"], math.nan)
        val = metrics.get("val_reward")
        table.add_row(
            str(record["step"]),
            f"{metrics.get('reward_mean', math.nan):.3f}",
            f"{task:.3f}",
            "-" if val is None else f"{val:.3f}",
            f"{elapsed:.0f}",
        )
        if reached is None and task >= args.target:
            reached = (record["step"], elapsed)
    console.print(table)
    console.print(summary.table())
    if reached is None:
        best = max(programmatic.values(), default=math.nan)
        console.print(
            f"task reward did not reach {args.target} in {len(records)} steps "
            f"(best {best:.2f}; target: within 20 steps and 600 s)"
        )
    else:
        step, seconds = reached
        console.print(
            f"task reward >= {args.target} at step {step}, {seconds:.0f} s after the trainer "
            f"started (target: within 20 steps and 600 s)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--judge", action="store_true", help="SmolLM2 as a logprob RULER judge")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of local-llm and of the trainer each (0 = one per core)",
    )
    main(parser.parse_args())
