"""Group commit: one writer task turns many concurrent records into one transaction.

Each caller hands over a `Batch` of rows and awaits its own commit, so a response is sent only once
its record is durable. While one transaction runs, new batches queue up and all of them go into the
next one, so under load the cost of a commit is shared and the event loop never blocks on the
database. Rows are applied kind by kind in dependency order (scenario, group, trajectory, call,
touch) with executemany. If a shared transaction fails, its batches are retried one by one so a
single bad record cannot lose its neighbours; the failing one gets a `StoreError`.

On SQLite the rows go to the sqlite3 cursor's `executemany` with SQL that SQLAlchemy compiled once
per statement and set of columns (`_SqlitePlans`): `Connection.execute` spends as long again on
per-call work (cache key, parameters, result object) as SQLite spends writing (measured on the
proxy's rows, one held connection, a tight loop: 212 us a transaction through `execute`, 133 us
through the cursor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import UpdateBase

from art_proxy.errors import StoreError
from art_proxy.store import schema
from art_proxy.store.engine import TransactionRunner
from art_proxy.store.fences import unfenced
from art_proxy.store.rows import Batch, CallRow, Row, RowKind

__all__ = ["Batch", "GroupCommitWriter", "Row", "RowKind"]

log = logging.getLogger(__name__)

# A bound on one transaction keeps a commit's latency bounded under a burst.
_MAX_BATCHES_PER_TRANSACTION = 512


# What the writer reads of a row (rows.py types each kind).
_Values = Mapping[str, Any]


@dataclass
class _Pending:
    batch: Batch
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def _statements(dialect: str) -> dict[RowKind, UpdateBase]:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    touch = (
        sa.update(schema.trajectories)
        .where(schema.trajectories.c.id == sa.bindparam("b_id"))
        .values(
            call_count=schema.trajectories.c.call_count + 1,
            updated_at=sa.bindparam("b_now"),
            tip_key=sa.func.coalesce(sa.bindparam("b_tip"), schema.trajectories.c.tip_key),
            tip_prompt_key=sa.func.coalesce(
                sa.bindparam("b_prompt"), schema.trajectories.c.tip_prompt_key
            ),
        )
    )
    return {
        # Scenarios, groups and explicit trajectory ids may be created by two proxies at once.
        RowKind.scenario: insert(schema.scenarios).on_conflict_do_nothing(),
        RowKind.group: insert(schema.groups).on_conflict_do_nothing(),
        RowKind.trajectory: insert(schema.trajectories).on_conflict_do_nothing(),
        RowKind.call: sa.insert(schema.calls),
        RowKind.touch: touch,
        RowKind.judgment: insert(schema.judgments).on_conflict_do_nothing(),
    }


@dataclass(frozen=True)
class _Plan:
    """One statement for one set of columns: its SQL, and how each `?` gets its value."""

    sql: str
    # The row's values in the placeholders' order (one C call for a whole row), then the
    # placeholders whose value needs converting (a datetime, a JSON column), each with its converter.
    read: Callable[[_Values], Sequence[Any]]
    converts: tuple[tuple[int, Callable[[Any], Any]], ...]

    def values(self, row: _Values) -> Sequence[Any]:
        values = self.read(row)
        if not self.converts:
            return values
        converted = list(values)
        for index, convert in self.converts:
            converted[index] = convert(converted[index])
        return converted


def _sqlite_datetime(value: datetime | None) -> str | None:
    """What SQLAlchemy's SQLite DATETIME writes ('2026-11-25 09:41:28.123456', any zone dropped
    as SQLAlchemy drops it), in one C call: its processor builds a dict a value, a tenth of the
    store thread's time when it ingests (six datetimes a recorded call)."""
    return None if value is None else value.isoformat(" ", "microseconds")[:26]


def _reader(keys: Sequence[str | None], fixed: Sequence[Any]) -> Callable[[_Values], Sequence[Any]]:
    """Reads a row's values for `keys`; a None key takes its value fixed in the statement."""
    if None in keys:
        pairs = list(zip(keys, fixed, strict=True))
        return lambda row: [value if key is None else row[key] for key, value in pairs]
    present = cast(Sequence[str], keys)
    if len(present) == 1:
        (only,) = present
        return lambda row: (row[only],)
    return operator.itemgetter(*present)


class _SqlitePlans:
    """Runs the writer's statements on SQLite through the sqlite3 cursor (see the module's
    docstring). The SQL and each value's conversion are SQLAlchemy's, as `execute` would make
    them: the statement compiled for the rows' columns, each bind's type processor (a datetime's
    by `_sqlite_datetime`, which writes the same text)."""

    def __init__(self, statements: dict[RowKind, UpdateBase]) -> None:
        self._statements = statements
        self._plans: dict[tuple[RowKind, tuple[str, ...]], _Plan] = {}

    def execute(self, connection: sa.Connection, kind: RowKind, rows: list[_Values]) -> None:
        # Rows of a kind come with their keys in one order: grouped by that order, not sorted.
        by_columns: dict[tuple[str, ...], list[_Values]] = {}
        for row in rows:
            by_columns.setdefault(tuple(row), []).append(row)
        cursor = connection.connection.cursor()
        try:
            for columns, same in by_columns.items():
                plan = self._plans.get((kind, columns)) or self._plan(connection, kind, columns)
                cursor.executemany(plan.sql, [plan.values(row) for row in same])
        finally:
            cursor.close()

    def _plan(self, connection: sa.Connection, kind: RowKind, columns: tuple[str, ...]) -> _Plan:
        dialect = connection.dialect
        compiled = self._statements[kind].compile(dialect=dialect, column_keys=list(columns))
        binds = [compiled.binds[name] for name in compiled.positiontup or []]
        for bind in binds:
            if bind.required and bind.key not in columns:
                raise sa.exc.InvalidRequestError(f"{kind.name} row without {bind.key!r}")
        converts: list[tuple[int, Callable[[Any], Any]]] = []
        for index, bind in enumerate(binds):
            convert = (
                _sqlite_datetime
                if isinstance(bind.type, sa.DateTime)
                else bind.type.dialect_impl(dialect).bind_processor(dialect)
            )
            if convert is not None:
                converts.append((index, convert))
        plan = _Plan(
            sql=str(compiled),
            read=_reader(
                [bind.key if bind.key in columns else None for bind in binds],
                [bind.effective_value for bind in binds],
            ),
            converts=tuple(converts),
        )
        self._plans[(kind, columns)] = plan
        return plan


class GroupCommitWriter:
    def __init__(self, dialect: str, runner: TransactionRunner) -> None:
        self._runner = runner
        self._statements = _statements(dialect)
        self._sqlite = _SqlitePlans(self._statements) if dialect == "sqlite" else None
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.commits = 0
        self.batches = 0
        # Records of a subject erased before they arrived, dropped (fences.py).
        self.erased_on_arrival = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="art-proxy-store-writer")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

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
        """Commit `group`, or fail the batches that cannot be written. Any exception counts, not
        only the database's (SQLAlchemy's, sqlite3's): a driver or a value's conversion may refuse
        a row (orjson's TypeError for a value nested too deeply, say), and a writer that died of
        it would leave every later call unrecorded."""
        try:
            await self.commit([pending.batch for pending in group])
        except Exception as exc:
            if len(group) == 1:
                _fail(group[0], exc)
                return
            log.warning(
                "group commit of %d batches failed (%s); retrying one by one", len(group), exc
            )
            for pending in group:
                try:
                    await self.commit([pending.batch])
                except Exception as single_exc:
                    _fail(pending, single_exc)
                else:
                    _succeed(pending)
            return
        for pending in group:
            _succeed(pending)

    async def commit(self, batches: Sequence[Batch], *, skip_recorded: bool = False) -> None:
        """Apply `batches` in one transaction, but those an erasure fenced (fences.py).
        `skip_recorded` leaves out the batches whose call is in the store already (the journal's
        ingester, replaying what may have landed)."""

        dropped = [0]

        def transaction(connection: sa.Connection) -> None:
            unrecorded = _unrecorded(connection, batches) if skip_recorded else batches
            kept = unfenced(connection, unrecorded)
            dropped[0] = len(unrecorded) - len(kept)
            by_kind: dict[RowKind, list[_Values]] = {}
            for batch in kept:
                for kind, row in batch.rows:
                    by_kind.setdefault(kind, []).append(row)
            for kind in sorted(by_kind):
                if self._sqlite is not None:
                    self._sqlite.execute(connection, kind, by_kind[kind])
                else:
                    connection.execute(self._statements[kind], by_kind[kind])

        await self._runner.run(transaction)
        self.commits += 1
        self.batches += len(batches)
        self.erased_on_arrival += dropped[0]


# SQLSTATE classes of an error in the record itself: 22 data exception, 23 integrity violation.
_REFUSAL_CLASSES = ("22", "23")


def refuses_record(exc: BaseException) -> bool:
    """Whether a failed commit says the store refused the record itself, rather than that it
    could not write at all (locked, disk full, read-only, unreachable, timed out). Only a refusal
    sets a record aside: anything else is an outage, retried until the store writes again, as
    Kafka's producers and PostgreSQL's own clients treat it. Refusals are what the databases
    classify so (SQLSTATE classes 22 and 23; SQLite's constraint, too-big and binding errors) and
    a value no driver can convert (orjson's TypeError for a value nested too deeply, an int past
    64 bits)."""
    cause = exc.orig if isinstance(exc, sa.exc.StatementError) and exc.orig is not None else exc
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate[:2] in _REFUSAL_CLASSES
    if isinstance(cause, sqlite3.Error):
        return isinstance(
            cause, sqlite3.IntegrityError | sqlite3.DataError | sqlite3.InterfaceError
        )
    if isinstance(exc, sa.exc.DBAPIError):
        return False  # a driver's error without a state: the connection's, not the record's
    return isinstance(cause, TypeError | ValueError | OverflowError)


def _call_id(batch: Batch) -> str | None:
    for kind, row in batch.rows:
        if kind is RowKind.call:
            return cast(CallRow, row)["id"]
    return None


def _unrecorded(connection: sa.Connection, batches: Sequence[Batch]) -> list[Batch]:
    """The batches whose call is not in the store yet."""
    ids = [call for batch in batches if (call := _call_id(batch)) is not None]
    recorded: set[str] = set()
    for start in range(0, len(ids), 500):  # SQLite's bound on bound parameters is far above
        query = sa.select(schema.calls.c.id).where(schema.calls.c.id.in_(ids[start : start + 500]))
        recorded.update(connection.execute(query).scalars())
    return [batch for batch in batches if _call_id(batch) not in recorded]


def _succeed(pending: _Pending) -> None:
    if not pending.done.done():
        pending.done.set_result(None)


def _fail(pending: _Pending, exc: Exception) -> None:
    if not pending.done.done():
        pending.done.set_exception(StoreError(f"{type(exc).__name__}: {exc}"))
