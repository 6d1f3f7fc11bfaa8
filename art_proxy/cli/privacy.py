"""`art-proxy lineage | forget | housekeeping`: what learned from a person's records, erasing
them, and deleting what is past retention."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from art_proxy.cli.options import settings_command
from art_proxy.cli.output import fail, stderr
from art_proxy.config import ForgetSettings, HousekeepingSettings, LineageSettings
from art_proxy.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from art_proxy.records import Lineage


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "lineage",
        LineageSettings,
        "The training steps and adapters that learned from a user's, tenant's or trajectory's records.",
    )(lineage)
    settings_command(
        app,
        "forget",
        ForgetSettings,
        "Erase every record of a user, tenant or trajectory (with --yes), and list the training "
        "steps and adapters that learned from them.",
    )(forget)
    settings_command(
        app,
        "housekeeping",
        HousekeepingSettings,
        "Delete what is older than --retain-days, as a proxy given it does every 10 minutes.",
    )(housekeeping)


def lineage(settings: LineageSettings) -> None:
    from art_proxy.journal.left_behind import opened_for_reading

    async def read() -> Lineage:
        async with opened_for_reading(settings.store, existing=True) as store:
            return await store.lineage(settings.subject())

    try:
        found = asyncio.run(read())
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    _print_lineage(settings.subject().describe(), found)


def forget(settings: ForgetSettings) -> None:
    from art_proxy.journal.directory import journal_directory, live_slots
    from art_proxy.journal.left_behind import opened_for_reading
    from art_proxy.privacy.erasure import deleted_text
    from art_proxy.privacy.erasure import forget as erase
    from art_proxy.records import Erasure

    subject = settings.subject()
    directory = journal_directory(settings.journal, settings.store)
    if directory is not None and live_slots(directory):
        fail(
            f"a proxy is running with the journal {directory}, which may hold the subject's "
            "latest calls: erase through it (POST /art/v1/forget), which erases its journal too"
        )

    async def run() -> Lineage | Erasure:
        # The journal given is taken in first: a stopped proxy's records in it would otherwise
        # come back with the next proxy started on it.
        async with opened_for_reading(settings.store, directory, existing=True) as store:
            if not settings.yes:
                return await store.lineage(subject)
            return await erase(store, subject, directory)

    try:
        done = asyncio.run(run())
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    if isinstance(done, Erasure):
        _print_lineage(subject.describe(), done.lineage)
        stderr.print(
            f"deleted {deleted_text(done.deleted)}; {done.journal_frames_dropped} set-aside "
            "journal records dropped"
        )
        return
    _print_lineage(subject.describe(), done)
    stderr.print(
        f"{len(done.trajectories)} trajectories would be deleted for good, with their calls, "
        "feedback, their groups' judgments and openings: pass --yes to delete them"
    )


def housekeeping(settings: HousekeepingSettings) -> None:
    from art_proxy.journal.directory import journal_directory
    from art_proxy.journal.left_behind import opened_for_reading
    from art_proxy.privacy.erasure import deleted_text
    from art_proxy.privacy.retention import expire

    async def run() -> dict[str, int]:
        async with opened_for_reading(settings.store, existing=True) as store:
            directory = journal_directory(settings.journal, settings.store)
            return await expire(store, settings.retain_days, directory)

    try:
        with stderr.status(f"deleting what is older than {settings.retain_days:g} days..."):
            deleted = asyncio.run(run())
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    stderr.print(f"deleted {deleted_text(deleted)}")


def _print_lineage(subject: str, lineage: Lineage) -> None:
    """The subject's steps and the adapters to retrain, on standard output."""
    out = Console(soft_wrap=True)
    out.print(
        f"{escape(subject)}: {len(lineage.trajectories)} trajectories in "
        f"{len(lineage.groups)} groups"
    )
    if not lineage.steps:
        out.print("no training step read them")
        return
    table = Table("run", "step", "kind", "status", "adapter", "groups")
    for step in lineage.steps:
        outcomes = Counter(step.groups.values())
        table.add_row(
            escape(step.run),
            str(step.step),
            step.kind,
            step.status,
            escape(step.adapter or "-"),
            ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items())),
        )
    out.print(table)
    adapters = lineage.derived_adapters
    out.print(
        "adapters that learned from them, to retrain: "
        + (", ".join(escape(adapter) for adapter in adapters) if adapters else "none")
    )
    if lineage.training_runs:
        out.print(
            "training on them now: "
            + ", ".join(escape(run) for run in lineage.training_runs)
            + " (the adapter each such step saves, and every later one of its run, learns from "
            "them too)"
        )
