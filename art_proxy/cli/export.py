"""`art-proxy export`: trajectories as JSONL, Parquet or a Hugging Face dataset."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import nullcontext
from pathlib import Path
from typing import IO, TYPE_CHECKING

import typer
from rich.markup import escape

from art_proxy.cli.options import settings_command
from art_proxy.cli.output import fail, stderr
from art_proxy.config import ExportSettings
from art_proxy.errors import ConfigError, StoreError
from art_proxy.privacy.private_files import open_private

if TYPE_CHECKING:
    from art_proxy.records import ExportedTrajectory
    from art_proxy.store.trajectory_store import TrajectoryStore


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "export",
        ExportSettings,
        "Write trajectories as JSONL (one a line), Parquet, a Hugging Face dataset, or TRL's "
        "conversational rows and preference pairs.",
    )(export)


def export(settings: ExportSettings) -> None:
    what = "trajectories"
    try:
        if settings.redact_pii:  # a redactor that cannot be built is said before the store
            from art_proxy.privacy.pii import pii_redactor

            pii_redactor(settings.pii_spacy_model)
        if settings.format in ("parquet", "hf"):
            count = asyncio.run(_export_table(settings))
        else:
            with (
                nullcontext(sys.stdout) if settings.out == "-" else open_private(settings.out, "w")
            ) as out:
                if settings.format == "trl":
                    count = asyncio.run(_export_trl(settings, out))
                    what = "preference pairs" if settings.pairs else "rows"
                else:
                    count = asyncio.run(_export(settings, out))
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    else:
        where = "standard output" if settings.out == "-" else settings.out
        stderr.print(f"exported {count} {what} to {escape(where)}")


async def _export_table(settings: ExportSettings) -> int:
    from art_proxy.export.table import write_hf_dataset, write_parquet
    from art_proxy.journal.left_behind import opened_for_reading

    async with opened_for_reading(settings.store, existing=True) as store:
        with stderr.status("exporting..."):
            trajectories = _exported(store, settings)
            write = write_parquet if settings.format == "parquet" else write_hf_dataset
            return await write(trajectories, Path(settings.out))


async def _export_trl(settings: ExportSettings, out: IO[str]) -> int:
    from art_proxy.export.trl import write_trl
    from art_proxy.journal.left_behind import opened_for_reading

    async with opened_for_reading(settings.store, existing=True) as store:
        with stderr.status("exporting..."):
            return await write_trl(
                lambda: _exported(store, settings), out, pairs=settings.pairs, kto=settings.kto
            )


async def _exported(
    store: TrajectoryStore, settings: ExportSettings
) -> AsyncIterator[ExportedTrajectory]:
    """The trajectories `settings` selects, whole, oldest first; with `--redact-pii`, personal
    data replaced consistently across the whole export."""
    from art_proxy.privacy.pii import pii_redactor, redacted_export

    placeholders = (
        pii_redactor(settings.pii_spacy_model).placeholders() if settings.redact_pii else None
    )
    async for exported in store.export(
        scenario=settings.scenario,
        status=settings.status,
        split=settings.split,
        user=settings.user,
        tenant=settings.tenant,
    ):
        yield exported if placeholders is None else redacted_export(exported, placeholders)


async def _export(settings: ExportSettings, out: IO[str]) -> int:
    from art_proxy.journal.left_behind import opened_for_reading

    count = 0
    async with opened_for_reading(settings.store, existing=True) as store:
        with stderr.status("exporting...") as status:
            async for exported in _exported(store, settings):
                out.write(exported.model_dump_json() + "\n")
                count += 1
                status.update(f"exported {count} trajectories")
    return count
