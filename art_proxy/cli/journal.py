"""`art-proxy journal rejected | replay | drop`: the records the store refused, set aside beside a
proxy's journal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from art_proxy.cli.options import command_group, settings_command
from art_proxy.cli.output import fail, stderr
from art_proxy.config import DropSettings, RejectedSettings, ReplaySettings
from art_proxy.errors import ConfigError, StoreError


def register(app: typer.Typer) -> None:
    journal_app = command_group(
        app,
        "journal",
        "Records the store refused, set aside beside a proxy's journal: list, put in again, drop.",
    )
    settings_command(
        journal_app,
        "rejected",
        RejectedSettings,
        "List the records the store refused.",
    )(journal_rejected)
    settings_command(
        journal_app,
        "replay",
        ReplaySettings,
        "Commit the refused records again; those the store still refuses stay, with its reason.",
    )(journal_replay)
    settings_command(
        journal_app,
        "drop",
        DropSettings,
        "Delete the refused records (with --yes).",
    )(journal_drop)


def _rejected_directory(settings: RejectedSettings) -> Path:
    from art_proxy.journal.directory import journal_directory

    directory = journal_directory(settings.journal, settings.store)
    if directory is None:
        fail("--journal off keeps no journal: nothing is set aside")
    assert directory is not None
    return directory


def journal_rejected(settings: RejectedSettings) -> None:
    from art_proxy.journal import rejected

    directory = _rejected_directory(settings)
    try:
        records = rejected.read(directory) if directory.is_dir() else []
    except OSError as exc:
        fail(str(exc))
    if not records:
        stderr.print(f"no records set aside in {escape(str(directory))}")
        return
    table = Table("call", "trajectory", "seq", "recorded", "bytes")
    for record in records:
        call = record.call
        if call is None:
            table.add_row("(unreadable)", "", "", "", str(len(record.payload)))
            continue
        when = call["created_at"].isoformat(" ", "seconds")
        table.add_row(
            call["id"], call["trajectory_id"], str(call["seq"]), when, str(len(record.payload))
        )
    Console().print(table)
    stderr.print(
        f"{len(records)} set aside in {escape(str(directory / rejected.REJECTED_FILE))}: "
        "art-proxy journal replay puts them in again once the cause is fixed; drop --yes "
        "deletes them"
    )


def journal_replay(settings: ReplaySettings) -> None:
    from art_proxy.journal import rejected
    from art_proxy.store.trajectory_store import TrajectoryStore

    directory = _rejected_directory(settings)

    async def run() -> rejected.Replayed:
        async with TrajectoryStore.opened(settings.store, writer=False) as store:
            return await rejected.replay(directory, store)

    try:
        replayed = asyncio.run(run())
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    stderr.print(
        f"{replayed.landed} records put in the store, {len(replayed.refused)} still refused"
    )
    for record, reason in replayed.refused:
        call = record.call
        stderr.print(f"  {escape(call['id'] if call else '(unreadable)')}: {escape(reason)}")


def journal_drop(settings: DropSettings) -> None:
    from art_proxy.journal import rejected

    directory = _rejected_directory(settings)
    try:
        if not settings.yes:
            count = rejected.count(directory)
            stderr.print(f"{count} records would be dropped for good: pass --yes to drop them")
            return
        dropped = rejected.drop(directory) if directory.is_dir() else 0
    except OSError as exc:
        fail(str(exc))
    stderr.print(f"dropped {dropped} records")
