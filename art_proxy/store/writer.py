"""Group commit: one writer task turns many concurrent records into one transaction.

Each caller hands over a `Batch` of rows and awaits its own commit, so a response is sent only once
its record is durable. While one transaction runs, new batches queue up and all of them go into the
next one, so under load the cost of a commit is shared and the event loop never blocks on the
database. Rows are applied kind by kind in dependency order (scenario, group, trajectory, call,
touch) with executemany. If a shared transaction fails, its batches are retried one by one so a
single bad record cannot lose its neighbours; the failing one gets a `StoreError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from art_proxy.errors import StoreError
from art_proxy.store import schema
from art_proxy.store.engine import TransactionRunner

log = logging.getLogger(__name__)

# A bound on one transaction keeps a commit's latency bounded under a burst.
_MAX_BATCHES_PER_TRANSACTION = 512


class RowKind(IntEnum):
    """Kinds of rows, in the order a transaction applies them (foreign keys first)."""

    scenario = 0
    group = 1
    trajectory = 2
    call = 3
    touch = 4  # bump a trajectory's call_count and updated_at, move its tip when answered


@dataclass(frozen=True)
class Batch:
    """The rows of one recorded event; committed together or not at all."""

    rows: Sequence[tuple[RowKind, dict[str, Any]]]


@dataclass
class _Pending:
    batch: Batch
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def _statements(dialect: str) -> dict[RowKind, sa.Executable]:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    touch = (
        sa.update(schema.trajectories)
        .where(schema.trajectories.c.id == sa.bindparam("b_id"))
        .values(
            call_count=schema.trajectories.c.call_count + 1,
            updated_at=sa.bindparam("b_now"),
            tip_key=sa.func.coalesce(sa.bindparam("b_tip"), schema.trajectories.c.tip_key),
        )
    )
    return {
        # Scenarios, groups and explicit trajectory ids may be created by two proxies at once.
        RowKind.scenario: insert(schema.scenarios).on_conflict_do_nothing(),
        RowKind.group: insert(schema.groups).on_conflict_do_nothing(),
        RowKind.trajectory: insert(schema.trajectories).on_conflict_do_nothing(),
        RowKind.call: sa.insert(schema.calls),
        RowKind.touch: touch,
    }


class GroupCommitWriter:
    def __init__(self, dialect: str, runner: TransactionRunner) -> None:
        self._runner = runner
        self._statements = _statements(dialect)
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.commits = 0
        self.batches = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="art-proxy-store-writer")

    async def write(self, batch: Batch) -> None:
        """Queue `batch` and return once it is committed; raises `StoreError` if it cannot be."""
        if self._task is None or self._task.done():
            raise StoreError("the store writer is not running")
        pending = _Pending(batch)
        self._queue.put_nowait(pending)
        await pending.done

    async def aclose(self) -> None:
        """Commit what is queued, then stop."""
        if self._task is None:
            await self._runner.aclose()
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self._runner.aclose()

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            group = [first]
            while not self._queue.empty() and len(group) < _MAX_BATCHES_PER_TRANSACTION:
                group.append(self._queue.get_nowait())
            try:
                await self._commit_group(group)
            finally:
                for _ in group:
                    self._queue.task_done()

    async def _commit_group(self, group: list[_Pending]) -> None:
        try:
            await self._apply([pending.batch for pending in group])
        except SQLAlchemyError as exc:
            if len(group) == 1:
                _fail(group[0], exc)
                return
            log.warning(
                "group commit of %d batches failed (%s); retrying one by one", len(group), exc
            )
            for pending in group:
                try:
                    await self._apply([pending.batch])
                except SQLAlchemyError as single_exc:
                    _fail(pending, single_exc)
                else:
                    _succeed(pending)
            return
        for pending in group:
            _succeed(pending)

    async def _apply(self, batches: list[Batch]) -> None:
        by_kind: dict[RowKind, list[dict[str, Any]]] = {}
        for batch in batches:
            for kind, row in batch.rows:
                by_kind.setdefault(kind, []).append(row)

        def transaction(connection: sa.Connection) -> None:
            for kind in sorted(by_kind):
                connection.execute(self._statements[kind], by_kind[kind])

        await self._runner.run(transaction)
        self.commits += 1
        self.batches += len(batches)


def _succeed(pending: _Pending) -> None:
    if not pending.done.done():
        pending.done.set_result(None)


def _fail(pending: _Pending, exc: Exception) -> None:
    if not pending.done.done():
        pending.done.set_exception(StoreError(f"{type(exc).__name__}: {exc}"))
