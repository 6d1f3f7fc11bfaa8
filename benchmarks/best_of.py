"""What best-of-N at serve time buys and costs: accuracy against latency and tokens.

The task of `examples/single_word/` (answer with one word; reward 1/words, 0 when cut off), asked by
its own agent code (`ask`: max_tokens 8, temperature 1) through art-proxy in front of local-llm
serving the bundled SmolLM2-135M-Instruct, all on loopback in this process. Each of the task's 20
questions is asked `--repeats` times as it is (best-of-1) and with `X-Art-Best-Of: N` for each N of
`--n`, the proxy choosing with the task's own check (`agent.py:check`). For each arm: the mean
reward of the answers the agent got and the share that were one word, each with a 95% interval
over the calls; the median and p90 latency of a call; the completion tokens generated per call
(every candidate counted, from the store). The arms take turns question by question, so drift in
the machine's speed falls on all of them alike. Last, the gain and cost of the largest N against
best-of-1.

    .venv/bin/python benchmarks/best_of.py [--n 2,4] [--repeats 3] [--questions 20] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from openai import AsyncOpenAI
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from art_proxy.local.cli import quiet_library_warnings
from art_proxy.local.model_loading import load_model
from art_proxy.local.served import ServedModel
from art_proxy.local.server import running_local_llm
from art_proxy.proxy.server import running_proxy
from art_proxy.scenarios import load_scenarios
from art_proxy.store.trajectory_store import TrajectoryStore
from benchmarks.grpo_peers import EXAMPLE
from examples.single_word.agent import ask, rate
from tests.conftest import proxy_settings

console = Console()


@dataclass
class Arm:
    n: int  # candidates; 1 = the call as it is
    rewards: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    group_ids: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return "as asked" if self.n == 1 else f"best-of-{self.n}"


def interval(values: Sequence[float]) -> str:
    """mean ± the half-width of a normal 95% interval over the calls."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {1.96 * statistics.stdev(values) / math.sqrt(len(values)):.2f}"


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(ns: list[int], repeats: int, questions: int) -> tuple[list[Arm], dict[int, float]]:
    asked = [str(s.input) for s in load_scenarios(str(EXAMPLE / "scenarios.jsonl"))][:questions]
    served = ServedModel.create(load_model(None), max_batch_size=16)
    model = served.name
    with tempfile.TemporaryDirectory() as scratch:
        store_url = f"sqlite:///{Path(scratch) / 'art.db'}"
        async with running_local_llm(served) as llm:
            settings = proxy_settings(
                store_url, llm.base_url, best_of_check=f"{EXAMPLE / 'agent.py'}:check"
            )
            async with running_proxy(settings) as proxy:
                arms = [Arm(n) for n in [1, *ns]]
                clients = {
                    arm.n: AsyncOpenAI(
                        base_url=proxy.base_url,
                        api_key="unused",
                        default_headers={"X-Art-Best-Of": str(arm.n)},
                    )
                    for arm in arms
                }
                await ask(clients[1], model, asked[0])  # warm-up, not counted
                with console.status("asking") as status:
                    for repeat in range(repeats):
                        for q, question in enumerate(asked):
                            for arm in arms:
                                started = time.perf_counter()
                                reply = await ask(clients[arm.n], model, question)
                                arm.seconds.append(time.perf_counter() - started)
                                choice = reply.choices[0]
                                arm.rewards.append(
                                    rate(choice.message.content, choice.finish_reason)
                                )
                            status.update(f"round {repeat + 1}/{repeats}, question {q + 1}")
                for openai in clients.values():
                    await openai.close()
                await proxy.parts.settled()
                tokens = await _tokens_per_call(proxy.parts.store)
    return arms, tokens


async def _tokens_per_call(store: TrajectoryStore) -> dict[int, float]:
    """Completion tokens generated per call, by candidates: every candidate of a best-of call
    (its group's calls), the one answer of a call as asked (1)."""
    listed = await store.trajectories(limit=100_000)
    calls = await store.calls([t.id for t in listed])

    def generated(trajectory_ids: list[str]) -> int:
        return sum(
            len(ids)
            for tid in trajectory_ids
            for call in calls.get(tid, [])
            for ids in call.completion_token_ids or []
        )

    groups: dict[str, list[str]] = {}
    chose_for: set[object] = set()  # the agents' trajectories a best-of call answered
    for t in listed:
        if t.finish_reason == "best_of":
            groups.setdefault(t.group_id, []).append(t.id)
            chose_for.add(t.metadata.get("best_of"))
    by_n: dict[int, list[int]] = {1: []}
    for members in groups.values():
        by_n.setdefault(len(members), []).append(generated(members))
    for t in listed:
        if t.finish_reason != "best_of" and t.id not in chose_for:
            by_n[1].append(generated([t.id]))
    return {n: statistics.fmean(counts) for n, counts in by_n.items() if counts}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="2,4", help="comma-separated candidate counts")
    parser.add_argument("--repeats", type=int, default=3, help="times each question is asked")
    parser.add_argument("--questions", type=int, default=20, help="the first N of the task's")
    parser.add_argument(
        "--quick", action="store_true", help="5 questions once, best-of-2: a smoke run"
    )
    args = parser.parse_args(argv)
    ns = [int(n) for n in args.n.split(",")]
    if args.quick:
        ns, args.repeats, args.questions = [2], 1, 5
    quiet_library_warnings()
    arms, tokens = asyncio.run(run(ns, args.repeats, args.questions))

    table = Table(title=f"single-word task, {len(arms[0].rewards)} calls an arm (95% CI)")
    for column in ("arm", "reward", "one word", "p50 s", "p90 s", "tokens/call"):
        table.add_column(column)
    for arm in arms:
        table.add_row(
            arm.name,
            interval(arm.rewards),
            interval([1.0 if r == 1.0 else 0.0 for r in arm.rewards]),
            f"{statistics.median(arm.seconds):.3f}",
            f"{quantile(arm.seconds, 0.9):.3f}",
            f"{tokens.get(arm.n, math.nan):.1f}",
        )
    console.print(table)
    plain, best = arms[0], arms[-1]
    console.print(
        f"{best.name} against as asked: reward {statistics.fmean(best.rewards):.2f} vs "
        f"{statistics.fmean(plain.rewards):.2f}, latency x"
        f"{statistics.median(best.seconds) / statistics.median(plain.seconds):.2f}, tokens x"
        f"{tokens.get(best.n, math.nan) / tokens[1]:.2f}",
        soft_wrap=True,
    )


if __name__ == "__main__":
    main()
