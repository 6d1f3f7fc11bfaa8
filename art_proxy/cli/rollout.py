"""`art-proxy rollout`: an agent run on scenarios through the proxy, one group a scenario."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import MofNCompleteColumn, Progress
from rich.table import Table

from art_proxy.cli.options import settings_command
from art_proxy.cli.output import fail, stderr
from art_proxy.config import RolloutSettings
from art_proxy.errors import ConfigError

if TYPE_CHECKING:
    from art_proxy.rollout import Agent, RolloutReport
    from art_proxy.scenarios import Scenario


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "rollout",
        RolloutSettings,
        "Run an agent group-size times on every scenario through the proxy, one group per scenario.",
    )(rollout)


def rollout(settings: RolloutSettings) -> None:
    from art_proxy.rollout import load_agent
    from art_proxy.scenarios import load_scenarios

    try:
        scenarios = load_scenarios(settings.scenarios)
        if settings.split is not None:
            scenarios = [s for s in scenarios if s.split == settings.split]
            if not scenarios:
                fail(f"{settings.scenarios}: no scenarios of split {settings.split}")
        agent = load_agent(settings.agent)
        report = asyncio.run(_rollouts(settings, agent, scenarios))
    except ConfigError as exc:
        fail(str(exc))
    else:
        _print_rollout_summary(report)
        if report.rollouts and not any(group.succeeded for group in report.groups):
            fail("no rollout succeeded")


async def _rollouts(
    settings: RolloutSettings, agent: Agent, scenarios: list[Scenario]
) -> RolloutReport:
    from art_proxy.rollout import run_rollouts

    columns = (*Progress.get_default_columns(), MofNCompleteColumn())
    with Progress(*columns, console=stderr, transient=True) as progress:
        bar = progress.add_task("rollouts", total=len(scenarios) * settings.group_size)
        return await run_rollouts(
            agent,
            scenarios,
            proxy_url=settings.proxy,
            group_size=settings.group_size,
            concurrency=settings.concurrency,
            timeout_s=settings.timeout,
            model=settings.model,
            api_key=settings.api_key,
            admin_key=settings.admin_key,
            progress=lambda done, _total: progress.update(bar, completed=done),
        )


def _agent_metrics_table(report: RolloutReport) -> Table | None:
    """The mean of each metric the agent reported, by split (None: it reported none)."""
    names = sorted({name for g in report.groups for m in g.metrics.values() for name in m})
    if not names:
        return None
    table = Table("split", *names, title="agent metrics (mean per rollout that reported it)")
    for split in sorted({group.split for group in report.groups}):
        reported = [m for g in report.groups if g.split == split for m in g.metrics.values()]
        cells = []
        for name in names:
            values = [m[name] for m in reported if name in m]
            cells.append(f"{sum(values) / len(values):.3f}" if values else "-")
        table.add_row(split, *cells)
    return table


# Failures listed under the summary; the rest are counted (each is in the trajectory's metadata).
_LISTED_FAILURES = 5


def _print_rollout_summary(report: RolloutReport) -> None:
    from art_proxy.rollout import ready_for_judging

    table = Table(
        "split",
        "groups",
        "judgeable",
        "rollouts",
        "failed",
        "timed out",
        "mean reward",
        title=f"rollouts in {report.seconds:.1f}s",
    )
    for split in sorted({group.split for group in report.groups}):
        groups = [group for group in report.groups if group.split == split]
        rewards = [r for g in groups for r in g.rewards.values() if r is not None]
        table.add_row(
            split,
            str(len(groups)),
            str(sum(ready_for_judging(group) for group in groups)),
            str(sum(len(group.trajectory_ids) for group in groups)),
            str(sum(len(group.errors) for group in groups)),
            str(sum(len(group.timed_out) for group in groups)),
            f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
        )
    console = Console()
    console.print(table)
    metrics = _agent_metrics_table(report)
    if metrics is not None:
        console.print(metrics)
    # The agent's error, else why a rollout that returned is not in the store.
    failures = [
        f"{trajectory}: {group.errors.get(trajectory) or group.unrecorded[trajectory]}"
        for group in report.groups
        for trajectory in group.trajectory_ids
        if trajectory in group.errors or trajectory in group.unrecorded
    ]
    for line in failures[:_LISTED_FAILURES]:
        console.print(escape(line), highlight=False, soft_wrap=True)
    if len(failures) > _LISTED_FAILURES:
        console.print(f"... and {len(failures) - _LISTED_FAILURES} more")
    for warning in report.warnings:
        stderr.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
