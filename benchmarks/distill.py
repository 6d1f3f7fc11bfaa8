"""Does a teacher's grade of every sampled token learn faster than GRPO's one number per
trajectory? GRPO alone, on-policy distillation (OPD) alone and both, side by side, several seeds.

The single-word task of `learning_curve.py` through `art-proxy up` (local-llm, SmolLM2-135M, the
proxy, SQLite), each arm and seed a fresh stack. Two teachers, each sharing the student's
tokenizer:

- **hint**: the served model itself, shown a hint the student never sees (`train
  --teacher-context`: "Reply with that one word only, for example: Apple", `agent.HINT`), scoring
  the student's own tokens (context distillation, self-distillation): the laptop's case.
- **trained**: the adapter the same seed's GRPO run ended with, served beside the base on the new
  stack (`train --teacher teacher`): a stronger model, as OPD is meant to be used. Its cost is
  that GRPO run.

Before the runs, each context teacher's own reward on the training questions (the context in its
prompt, 8 samples a question) is measured: what OPD from it can reach. OPD alone trains on the
teacher's term only (`--no-group-advantage`); GRPO + OPD adds it to the group advantage
(`--teacher-weight 1`).

Two tasks: `single-word` (reward 1/words of an answer that ended, `agent.py:rollout`): steps and
seconds to the first step whose training rollouts reach `--target`; and `strict` (1 for exactly one
word, else 0, `agent.py:rollout_strict`), where most of the base model's groups all fail and carry
no spread for GRPO: the last validation reward. Per arm and seed it prints the run; last, per arm,
the steps to target over seeds, its ratio to GRPO's, and the final validation with its 95%
interval over seeds.

    .venv/bin/python benchmarks/distill.py --tasks single-word                 # 3 seeds
    .venv/bin/python benchmarks/distill.py --tasks single-word --seeds 1 --steps 2   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path

from benchmarks.learning_curve_summary import Arm, seed_interval  # noqa: E402  # after the path
from examples.single_word.agent import HINT  # noqa: E402

ARMS = ("GRPO", "OPD, hint", "OPD, trained", "GRPO + OPD, trained")


@dataclass(frozen=True)
class Result:
    task: str
    arm: str
    seed: int
    steps_to_target: int | None
    seconds_to_target: float | None
    last_val: float | None
    last_teacher_kl: float | None  # the reverse KL from the teacher at the run's last step


def arm(name: str, *, strict: bool, seed: int, trained: Path | None) -> Arm:
    """The arm `name` of ARMS; `trained`: the adapter of the seed's GRPO run (the trained
    teacher)."""
    return Arm(
        "local",
        strict=strict,
        seed=seed,
        teacher_context=HINT if name.endswith("hint") else None,
        teacher_adapter=trained if name.endswith("trained") else None,
        group_advantage=name.startswith("GRPO"),
        name=f"{'strict' if strict else 'single-word'}, {name}, seed {seed}",
    )


def main(args: argparse.Namespace) -> None:
    from art_proxy.cpu_sharing import share_cpu_cores

    share_cpu_cores()  # before torch loads
    from benchmarks.learning_curve import run_engine
    from benchmarks.learning_curve_summary import console

    alone = teacher_alone(HINT, args.threads) if "OPD, hint" in args.arms else "not run"
    console.print(f"the hint teacher alone (the hint in its prompt): reward {alone}")
    results: list[Result] = []
    for task in args.tasks:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            trained = None
            for name in args.arms:
                if name.endswith("trained") and trained is None:
                    continue  # the seed's GRPO run kept no adapter
                run = run_engine(
                    arm(name, strict=task == "strict", seed=seed, trained=trained), args
                )
                if name == "GRPO":
                    trained = run.adapter
                vals = [row.val for row in run.rows if row.val is not None]
                kl = [r.teacher_kl for r in run.rows if r.teacher_kl is not None]
                results.append(
                    Result(
                        task,
                        name,
                        seed,
                        None if run.reached is None else run.reached[0],
                        None if run.reached is None else run.reached[1] - run.first_rollout_s,
                        vals[-1] if vals else None,
                        kl[-1] if kl else None,
                    )
                )
                console.print(f"{task}, {name}, seed {seed}: {results[-1]}")
    console.print(_table(results, args))
    console.print(f"the hint teacher alone: reward {alone}; the trained teacher: GRPO's last step")
    console.print(_figures(results, args))  # the key figures, last


def teacher_alone(context: str, threads: int) -> str:
    """The served model's own reward on the training questions with `context` added to its
    system message as the teacher sees it (`guided_messages`), 8 samples a question: the mean with
    its 95% interval over questions."""
    import json
    import os

    from art_proxy.testing.loopback import free_port

    lines = (ROOT / "examples/single_word/scenarios.jsonl").read_text().splitlines()
    scenarios = [json.loads(line) for line in lines if line.strip()]
    questions = [s["input"] for s in scenarios if s.get("split", "train") == "train"]
    port = free_port()
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    env = {**os.environ, "ART_PROXY_THREADS": str(threads)}
    argv = [art_proxy, "local-llm", "--port", str(port)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        means = asyncio.run(_rewards(port, server, questions, context))
    finally:
        server.terminate()
        server.wait(timeout=60)
    return seed_interval(means)


async def _rewards(
    port: int, server: subprocess.Popen[bytes], questions: list[str], context: str
) -> list[float]:
    from openai import AsyncOpenAI

    from art_proxy.proxy.guidance import guided_messages
    from art_proxy.records import JsonObject
    from art_proxy.testing.loopback import wait_healthy
    from examples.single_word.agent import MAX_TOKENS, SYSTEM, rate

    await wait_healthy(f"http://127.0.0.1:{port}/health", server, timeout_s=600)
    async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-") as client:
        model = (await client.models.list()).data[0].id

        async def scored(question: str) -> float:
            messages: list[JsonObject] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ]
            reply = await client.chat.completions.create(
                model=model,
                messages=cast(Any, guided_messages(messages, context)),
                max_tokens=MAX_TOKENS,
                temperature=1.0,
                n=8,
            )
            return statistics.fmean(rate(c.message.content, c.finish_reason) for c in reply.choices)

        return list(await asyncio.gather(*(scored(question) for question in questions)))


def _steps(results: list[Result], task: str, name: str, args: argparse.Namespace) -> list[float]:
    """Steps to target per seed; a seed that never reached it counts as the run's length + 1."""
    return [
        float(r.steps_to_target if r.steps_to_target is not None else args.steps + 1)
        for r in results
        if r.task == task and r.arm == name
    ]


def _table(results: list[Result], args: argparse.Namespace) -> Table:
    table = Table(
        title=f"GRPO, OPD and both: SmolLM2-135M taught by itself with a hint, or by its GRPO "
        f"adapter; {args.steps} steps, {args.group_size} rollouts x {args.groups_per_step} "
        "groups a step"
    )
    columns = ("task", "arm", "seeds at target", "steps to target", "x GRPO", "s to target")
    for column in (*columns, "last val (95%)", "last teacher KL"):
        table.add_column(column, justify="right")
    for task in args.tasks:
        grpo = _steps(results, task, "GRPO", args)
        for name in ARMS:
            mine = [r for r in results if r.task == task and r.arm == name]
            if not mine:
                continue
            steps = _steps(results, task, name, args)
            reached = [r.seconds_to_target for r in mine if r.seconds_to_target is not None]
            kls = [r.last_teacher_kl for r in mine if r.last_teacher_kl is not None]
            table.add_row(
                task,
                name,
                f"{len(reached)} of {len(mine)}",
                seed_interval(steps),
                f"{statistics.fmean(steps) / statistics.fmean(grpo):.2f}" if grpo else "-",
                seed_interval(reached),
                seed_interval([r.last_val for r in mine if r.last_val is not None]),
                seed_interval(kls),
            )
    return table


def _figures(results: list[Result], args: argparse.Namespace) -> str:
    parts = []
    for task in args.tasks:
        grpo = _steps(results, task, "GRPO", args)
        for name in ARMS:
            steps = _steps(results, task, name, args)
            vals = [
                r.last_val
                for r in results
                if r.task == task and r.arm == name and r.last_val is not None
            ]
            if not steps:
                continue
            ratio = statistics.fmean(steps) / statistics.fmean(grpo) if grpo else math.nan
            parts.append(
                f"{task} {name}: {statistics.fmean(steps):.1f} steps ({ratio:.2f}x GRPO), "
                f"val {seed_interval(vals)}"
            )
    return f"to a training reward of {args.target} (never: {args.steps + 1}): " + "; ".join(parts)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tasks",
        type=lambda text: text.split(","),
        default=["single-word", "strict"],
        help="comma-separated: single-word, strict",
    )
    parser.add_argument(
        "--arms",
        type=lambda text: [ARMS[int(i)] for i in text.split(",")],
        default=list(ARMS),
        help="comma-separated indexes into "
        + ", ".join(f"{i}: {a}" for i, a in enumerate(ARMS))
        + " (the trained teacher's arms need GRPO's)",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds run: from this one")
    from benchmarks.learning_curve import add_run_arguments  # no torch: before share_cpu_cores

    add_run_arguments(parser)
    main(parser.parse_args())
