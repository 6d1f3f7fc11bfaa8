"""What a stopped proxy left in its journal, taken in by the store's readers before they read.

A proxy answers a call once its record is journaled; the store has it only once the ingester moved
it. A proxy killed (or stopped while the store was down) leaves the rest in its journal slot, which
the next proxy of the store adopts. Until one starts, `art-proxy export`, the judge and the trainer
would read a store without those calls. So each of them, before it reads, ingests the slots no
live proxy holds in the store's default journal directory (`--journal auto`: `FILE.journal` beside
a SQLite store): the same adoption a proxy does at start, with the same exactly-once ingestion by
call id. A journal under another `--journal` directory is found by a proxy or a reader given it
(`art-proxy forget --journal DIR` takes it in before it erases).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from art_proxy.config import JOURNAL_AUTO, Durability
from art_proxy.errors import ConfigError, StoreError
from art_proxy.store.trajectory_store import TrajectoryStore

from .directory import SEGMENT_SUFFIX, journal_directory
from .ingester import Ingester
from .segments import Journal

log = logging.getLogger(__name__)

_INGEST_TIMEOUT_S = 60.0


@asynccontextmanager
async def opened_for_reading(
    url: str, journal: Path | None = None, *, existing: bool = False
) -> AsyncIterator[TrajectoryStore]:
    """The store at `url`, with what stopped proxies left in its journal ingested first (see the
    module; `journal`: a directory given with `--journal`, taken in too), closed when the block
    ends; raises as `TrajectoryStore.open` (`existing`: refuses a SQLite store not there)."""
    store = await TrajectoryStore.open(url, writer=False, existing=existing)
    try:
        given = (journal_directory(JOURNAL_AUTO, url), journal)
        for directory in sorted({d for d in given if d is not None}):
            await ingest_left_behind(url, directory)
        yield store
    finally:
        await store.aclose()


async def ingest_left_behind(url: str, directory: Path) -> int:
    """Ingest the journal slots of `directory` that no live proxy holds; how many records went
    in. A directory that cannot be taken is left as it is, with a warning: reading goes on
    without those records.

    Taken in as `--durability power` keeps them, whatever the stopped proxy promised (the journal
    does not say, and the cost is a reader's, once): each commit survives a power loss before the
    segments it empties are deleted, and the deletions are synced before the reader reads."""
    if not _holds_segments(directory):
        return 0
    try:
        journal = Journal.open(directory, url, Durability.power)
    except ConfigError as exc:
        log.warning("records a stopped proxy journaled are not read: %s", exc)
        return 0
    try:
        async with TrajectoryStore.opened(url, writer=False, power_safe=True) as power_safe:
            ingester = Ingester(journal, power_safe)
            ingester.start()
            left = await ingester.aclose(_INGEST_TIMEOUT_S)
            await journal.deletions_synced()
    finally:
        journal.close()
    if left:
        raise StoreError(
            f"{left} answered calls wait in the journal {directory} and the store did not take "
            f"them within {_INGEST_TIMEOUT_S:.0f} s ({ingester.state.last_error}): they are not "
            "read"
        )
    if ingester.state.ingested:
        log.warning(
            "took in %d records a stopped proxy left in its journal %s",
            ingester.state.ingested,
            directory,
        )
    return ingester.state.ingested


def _holds_segments(directory: Path) -> bool:
    return any(directory.glob("*/*" + SEGMENT_SUFFIX))
