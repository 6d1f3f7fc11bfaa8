"""The ingester: moves journaled records into the store, in order, in batches, behind the proxy.

One transaction takes up to `_MAX_FRAMES` frames (the group-commit writer's statements). Frames
that may be in the store already (an earlier run's, or those of a transaction whose outcome was
lost with its connection) are filtered by call id inside the transaction, so a record lands exactly
once. While the store cannot write (unreachable, locked, a full disk, read-only: any failure that
is not about the record, see `refuses_record`) the ingester waits, retries the same transaction
with backoff and says so in the log; the proxy keeps answering and journaling. A record the store
itself refuses (a constraint, data it cannot take) is set aside in `rejected-records` beside the
journal and counted, so it cannot hold up every record behind it. A fault of the journal's own
disk (setting a record aside, say) is retried the same way: ingestion never stops for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import cast

from art_proxy.errors import StoreError
from art_proxy.store.rows import Batch, Row, RowKind, TrajectoryRow
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.store.writer import refuses_record

from . import rejected
from .entries import Entry, decode
from .segments import Journal, PendingFrame

log = logging.getLogger(__name__)

_MAX_FRAMES = 512  # the writer's bound on one transaction
# How long the ingester gathers frames before a transaction, unless a reader waits on it or a
# transaction's worth is waiting: a transaction's own cost (its thread hop, its commit) is then
# shared by the calls of 10 ms. At 5 ms, and with no wait after a transaction, sequential calls
# shared each commit three or four ways, and the ingester's work on the other core and the event
# loop added to their latency (measured A/B: -0.12 to -0.24 ms p50, the store thread's
# CPU a call 404 -> 229 us; 20 ms measured the same as 10). Longer would widen the window in which
# a second proxy on the store does not yet see a call (docs/operations.md, "What readers see").
_LINGER_S = 0.01
_MAX_BYTES = 4 * 1024 * 1024  # decoded on the event loop: a bound on one pause
_BACKOFF_S = (0.05, 2.0)  # first and longest wait between tries while the store is unavailable
_REPORT_EVERY_S = 10.0


@dataclass
class IngestState:
    """Exposed on /health."""

    ingested: int = 0
    rejected: int = 0  # refused by a store that was up: kept in `rejected-records`
    unavailable_since: float | None = None  # wall clock; None while the store takes records
    last_error: str | None = None
    oldest_pending_at: float | None = None  # wall clock of the oldest frame not yet ingested


class Ingester:
    def __init__(self, journal: Journal, store: TrajectoryStore) -> None:
        self._journal = journal
        self._store = store
        # Counted across restarts: what is set aside stays until someone looks at it.
        self.state = IngestState(rejected=rejected.count(journal.directory))
        self._task: asyncio.Task[None] | None = None
        self._doubtful = False  # the last transaction failed: it may have committed anyway
        self._reported = 0.0  # when the outage was last logged

    def start(self) -> None:
        if not self._store.migrated:  # unreachable when the proxy started (which logged it)
            self.state.unavailable_since = self._reported = time.time()
            self.state.last_error = "not reachable when the proxy started"
        self._task = asyncio.create_task(self._run(), name="art-proxy-ingester")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def aclose(self, timeout_s: float) -> int:
        """Ingest what is journaled for up to `timeout_s`, then stop; returns the frames left."""
        if self.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._journal.settled(), timeout_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        return self._journal.backlog_frames

    async def _run(self) -> None:
        await self._until_migrated()
        journal = self._journal
        while True:
            journal.appended.clear()
            if journal.backlog_frames == 0:
                self.state.oldest_pending_at = None
                await journal.appended.wait()
            # Lingering after a transaction too, not only after an idle wait: otherwise the
            # frames appended during a commit went into a small transaction of their own.
            await self._linger()
            journal.wanted.clear()
            pending = journal.pending(_MAX_FRAMES, _MAX_BYTES)
            if pending:
                await self._ingest_or_wait(pending)

    async def _ingest_or_wait(self, pending: list[PendingFrame]) -> None:
        """`_ingest`, or a pause after an OSError of the journal's own files: the frames stay
        pending and the next pass takes them again."""
        try:
            await self._ingest(pending)
        except OSError as exc:
            self.state.last_error = f"journal: {type(exc).__name__}: {exc}"[:300]
            log.error("ingesting the journal failed (%s); retrying", self.state.last_error)
            await asyncio.sleep(_BACKOFF_S[1])

    async def _linger(self) -> None:
        """Let more calls finish, so that one transaction takes them all and its commit keeps
        out of the way of the calls in flight; not when a reader waits or a full transaction's
        worth is waiting (a backlog after an outage goes in at full speed)."""
        journal = self._journal
        if journal.wanted.is_set() or journal.backlog_frames >= _MAX_FRAMES:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_LINGER_S):
                await journal.wanted.wait()

    async def _until_migrated(self) -> None:
        """A store that could not be reached when the proxy started: bring its schema to the
        newest revision as soon as it answers, before anything is ingested into it."""
        backoff = _BACKOFF_S[0]
        while not self._store.migrated:
            try:
                await self._store.migrate()
            except StoreError as exc:
                self._unavailable(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_S[1])
        self._available()

    async def _ingest(self, pending: list[PendingFrame]) -> None:
        """Put `pending` in the store, however long the store takes to come back."""
        entries: list[Entry | None] = []
        for item in pending:
            try:
                entries.append(decode(item.frame.payload))
            except ValueError as exc:  # its checksum held: written so by a bug, not a crash
                await self._reject(item, exc)
                entries.append(None)
        self.state.oldest_pending_at = _oldest(entries)
        erased = self._store.writer.erased_on_arrival
        start, alone, backoff = 0, False, _BACKOFF_S[0]
        while start < len(pending):
            stop = start + 1 if alone else len(pending)
            batches = [entry.batch for entry in entries[start:stop] if entry is not None]
            verify = self._doubtful or any(item.recovered for item in pending[start:stop])
            try:
                if batches:
                    await self._store.writer.commit(batches, skip_recorded=verify)
            except Exception as exc:  # the driver's, a value's conversion: see writer.py
                self._doubtful = True
                if not refuses_record(exc):
                    self._unavailable(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _BACKOFF_S[1])
                    continue
                if stop - start > 1:
                    alone = True  # find the record the store refuses, keep its neighbours
                    continue
                entry = entries[start]
                if entry is not None and await self._erased(entry.batch):
                    self._store.writer.erased_on_arrival += 1  # dropped, as a fence drops one
                else:
                    await self._reject(pending[start], exc)
                    if entry is not None:
                        await self._create_its_trajectory(entry.batch)
            else:
                self._doubtful = False
                self._available()
                self.state.ingested += len(batches)
            self._journal.consume(pending[stop - 1].end, stop - start)
            start = stop
            self.state.oldest_pending_at = _oldest(entries[start:])
        if self._store.writer.erased_on_arrival > erased:
            # Records an erasure dropped on arrival: their bytes leave the disk now, not when
            # their segment fills (`seal` deletes every segment whose records are all ingested).
            self._journal.seal()

    def _unavailable(self, exc: Exception) -> None:
        now = time.time()
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        state = self.state
        if state.unavailable_since is None:
            state.unavailable_since = now
            self._reported = now
            log.error(
                "STORE UNAVAILABLE (%s): calls are still answered and journaled in %s; "
                "they go to the store when it returns",
                reason,
                self._journal.directory,
            )
        elif now - self._reported >= _REPORT_EVERY_S:
            self._reported = now
            log.error(
                "store still unavailable after %.0f s (%s): %d records (%.1f MB) journaled, "
                "the oldest %.0f s old",
                now - state.unavailable_since,
                reason,
                self._journal.backlog_frames,
                self._journal.backlog_bytes / 1e6,
                now - (state.oldest_pending_at or now),
            )
        state.last_error = reason

    def _available(self) -> None:
        since = self.state.unavailable_since
        if since is not None:
            self.state.unavailable_since = None
            log.warning(
                "store available again after %.0f s: ingesting %d journaled records",
                time.time() - since,
                self._journal.backlog_frames,
            )

    async def _erased(self, refused: Batch) -> bool:
        """Whether a refused record is of a trajectory an erasure fenced: set aside, it would
        keep erased words where no erasure reaches (its trajectory is gone for good)."""
        try:
            return await self._store.of_an_erased_trajectory(refused)
        except StoreError:
            return False  # set aside: `journal replay` and `forget --journal` still see it

    async def _create_its_trajectory(self, refused: Batch) -> None:
        """After a record is refused: its trajectory's rows, if it was the first call, so that
        the trajectory's later calls are not refused too for want of it."""
        creation: list[tuple[RowKind, Row]] = []
        for kind, row in refused.rows:
            if kind is RowKind.trajectory:
                creation.append((kind, {**cast(TrajectoryRow, row), "call_count": 0}))
            elif kind < RowKind.call:
                creation.append((kind, row))
        if creation:
            with contextlib.suppress(Exception):  # refused too: its calls will say so
                await self._store.writer.commit([Batch(creation)])

    async def _reject(self, item: PendingFrame, exc: Exception) -> None:
        # Setting aside fsyncs the file (and its directory when it creates it): off the loop.
        await asyncio.to_thread(rejected.set_aside, self._journal.directory, item.frame.payload)
        self.state.rejected += 1
        log.error(
            "the store refused a journaled record (%s: %s); it is kept in %s (%d so far: "
            "art-proxy journal rejected lists them, replay puts them in again)",
            type(exc).__name__,
            str(exc).splitlines()[0][:300] if str(exc) else "",
            self._journal.directory / rejected.REJECTED_FILE,
            self.state.rejected,
        )


def _oldest(entries: list[Entry | None]) -> float | None:
    """When the first of `entries` (None for an unreadable frame) was appended."""
    return next((entry.appended_at for entry in entries if entry is not None), None)


def age_s(appended_at: float | None) -> float:
    """Seconds since a wall-clock time of the ingester's state (0 for None)."""
    return 0.0 if appended_at is None else max(0.0, time.time() - appended_at)
