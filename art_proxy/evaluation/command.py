"""`art-proxy eval`'s command: progress on standard error while the arms run, then the report's
table, the files written and, last, one line per arm that failed."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import MofNCompleteColumn, Progress, TaskID

from art_proxy.config import EvalSettings
from art_proxy.errors import ConfigError
from art_proxy.evaluation.report import table, verdicts, write
from art_proxy.evaluation.run import run_evaluation
from art_proxy.privacy.redaction import redact_url
from art_proxy.progress_lines import ProgressLines
from art_proxy.records import EvaluationReport
from art_proxy.rollout import Agent, load_agent
from art_proxy.scenarios import Scenario, load_scenarios


def evaluate(settings: EvalSettings, out: Console, err: Console) -> EvaluationReport:
    """Raises `ConfigError` (and the judge's and store's errors) before anything runs."""
    scenarios = load_scenarios(settings.scenarios)
    if settings.split is not None:
        scenarios = [s for s in scenarios if s.split == settings.split]
    if not scenarios:
        split = f" of split {settings.split}" if settings.split else ""
        raise ConfigError(f"{settings.scenarios}: no scenarios{split} (--split)")
    agent = load_agent(settings.agent)
    report = asyncio.run(_evaluate(settings, agent, scenarios, err))
    out.print(table(report))
    for line in verdicts(report):
        out.print(escape(line), highlight=False)
    # Which store: a misread default (sqlite:///art.db) is the first thing to rule out.
    err.print(
        f"rollouts recorded in {escape(redact_url(settings.store))} (split eval, never trained on)",
        highlight=False,
        soft_wrap=True,  # a path is copied, not read: never cut at the terminal's width
    )
    if settings.out is not None:
        for path in write(report, Path(settings.out)):
            out.print(f"wrote {path}", highlight=False)
    for arm in report.arms:
        if arm.error and not arm.rollouts:
            err.print(
                f"[yellow]arm {escape(arm.label)} did not run:[/yellow] {escape(arm.error)}",
                highlight=False,
            )
    return report


async def _evaluate(
    settings: EvalSettings, agent: Agent, scenarios: list[Scenario], err: Console
) -> EvaluationReport:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    columns = (*Progress.get_default_columns(), MofNCompleteColumn())
    try:
        with Progress(*columns, console=err, transient=True) as progress:
            bars: dict[str, TaskID] = {}
            lines = ProgressLines(err)  # where no bar shows: the counts as lines

            def advance(label: str, done: int, total: int) -> None:
                if label not in bars:
                    bars[label] = progress.add_task(label, total=total)
                progress.update(bars[label], completed=done)
                lines.count(f"arm {label}: rollouts", done, total)

            return await run_evaluation(
                settings,
                agent,
                scenarios,
                progress=advance,
                stop=stop,
            )
    finally:
        loop.remove_signal_handler(signal.SIGINT)
