"""Simulated production traffic that teaches the agent online, on the embedded stack.

    .venv/bin/python examples/online_learning/simulate.py --rounds 8

Starts `art-proxy local-llm`, `art-proxy serve --default-split prod --shadow-fraction ...` and the
sidecar `art-proxy train --promote-alias assistant ...` as separate processes on free ports, with a
SQLite store in `--workdir`. Then, round by round: users ask `assistant` one-word questions and rate
the answers, the shadow samples are rated, the candidate alias is validated, and the round waits
for the trainer to take what it can (traffic.py). It ends with a one-screen summary, and stops every
process on exit, on Ctrl-C and when one of them dies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from art_proxy.records import AliasRequest
from art_proxy.scenarios import Scenario, load_scenarios
from art_proxy.testing.loopback import free_port
from art_proxy.up.parts import StackError, console
from art_proxy.up.supervisor import Supervisor

# Run as a file, the repository root is not importable; the example shares examples/single_word.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.online_learning.api import ArtApi  # noqa: E402 (needs the path above)
from examples.online_learning.report import print_summary, round_line  # noqa: E402
from examples.online_learning.stack import (  # noqa: E402
    CANDIDATE_ALIAS,
    PROD_ALIAS,
    StackOptions,
    services,
    trainer,
)
from examples.online_learning.traffic import RoundReport, run_round, trainer_caught_up  # noqa: E402

SCENARIOS = ROOT / "examples/single_word/scenarios.jsonl"


@dataclass(frozen=True)
class Options:
    rounds: int
    users: int
    shadow_fraction: float
    shadow_samples: int
    val_samples: int
    groups_per_step: int
    rollback_min_trajectories: int
    step_timeout: float
    model: str | None
    workdir: Path | None
    seed: int


def parse_options(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--rounds", type=int, default=8, help="rounds of traffic (default 8)")
    add("--users", type=int, default=8, help="users asking a question each round (default 8)")
    add("--shadow-fraction", type=float, default=1.0, help="share of calls sampled again")
    add("--shadow-samples", type=int, default=3, help="extra samples of a shadowed call")
    add("--val-samples", type=int, default=4, help="answers per val question each round")
    add("--groups-per-step", type=int, default=2, help="groups with a spread per trainer step")
    add("--rollback-min-trajectories", type=int, default=8, help="prod answers before rollback")
    add("--step-timeout", type=float, default=600, help="seconds a round waits for the trainer")
    add("--model", help="HF directory or .gguf for local-llm and the trainer (default: SmolLM2)")
    add("--workdir", type=Path, help="store and trainer output (default: a new temporary dir)")
    add("--seed", type=int, default=0, help="seeds the order questions are asked in")
    args = parser.parse_args(argv)
    return Options(**vars(args))


class Questions:
    """The train questions in a shuffled cycle: a round asks each at most once."""

    def __init__(self, scenarios: list[Scenario], seed: int) -> None:
        self._inputs = [str(s.input) for s in scenarios]
        self._random = random.Random(seed)
        self._queue: list[str] = []

    def draw(self, count: int) -> list[str]:
        drawn: list[str] = []
        while len(drawn) < count:
            if not self._queue:
                self._queue = list(self._inputs)
                self._random.shuffle(self._queue)
            drawn.append(self._queue.pop())
        return drawn


async def simulate(options: Options) -> int:
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="online-learning-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = StackOptions(
        workdir=workdir,
        model=options.model,
        shadow_fraction=options.shadow_fraction,
        shadow_samples=options.shadow_samples,
        groups_per_step=options.groups_per_step,
        rollback_min_trajectories=options.rollback_min_trajectories,
        llm_port=free_port(),
        port=free_port(),
    )
    scenarios = load_scenarios(SCENARIOS)
    questions = Questions([s for s in scenarios if s.split == "train"], options.seed)
    val_scenarios = [s for s in scenarios if s.split == "val"]
    # The users' SDK finds the proxy through its environment, as in production.
    os.environ["OPENAI_BASE_URL"] = f"{stack.proxy_root}/v1"
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    console.print(f"workdir: {escape(str(workdir))} (store art.db, trainer/)")
    try:
        async with Supervisor() as supervisor, aiohttp.ClientSession() as http:
            api = ArtApi(http, stack.proxy_root)
            for part in services(stack):
                await supervisor.start(part)
            base = await served_model(http, stack.llm_port)
            for alias in (PROD_ALIAS, CANDIDATE_ALIAS):
                await api.move_alias(alias, AliasRequest(model=base, reason="manual"))
            await supervisor.start(trainer(stack))
            reports = await run_rounds(api, options, questions, val_scenarios, supervisor)
            await print_summary(api, reports)
        return 0
    except StackError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1


async def served_model(http: aiohttp.ClientSession, llm_port: int) -> str:
    async with http.get(f"http://127.0.0.1:{llm_port}/v1/models") as response:
        name: str = (await response.json())["data"][0]["id"]
        return name


async def run_rounds(
    api: ArtApi,
    options: Options,
    questions: Questions,
    val_scenarios: list[Scenario],
    supervisor: Supervisor,
) -> list[RoundReport]:
    reports: list[RoundReport] = []
    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    )
    with progress:
        task = progress.add_task("starting", total=None)

        def status(text: str) -> None:
            progress.update(task, description=text)

        for number in range(1, options.rounds + 1):
            report = await supervisor.watch(
                run_round(
                    api,
                    number,
                    questions.draw(options.users),
                    val_scenarios,
                    shadow_samples=options.shadow_samples,
                    val_samples=options.val_samples,
                    status=status,
                )
            )
            reports.append(report)
            status(f"round {number}: waiting for the trainer")
            steps = await supervisor.watch(
                trainer_caught_up(
                    api,
                    [g for r in reports for g in r.group_ids],
                    options.groups_per_step,
                    options.step_timeout,
                )
            )
            report.steps = len(steps)
            report.serving = await api.alias_target(PROD_ALIAS) or "?"
            console.print(round_line(report))
    return reports


def main() -> None:
    options = parse_options()
    if options.rounds < 1 or options.users < 1:
        sys.exit("--rounds and --users must be at least 1")
    sys.exit(asyncio.run(simulate(options)))


if __name__ == "__main__":
    main()
