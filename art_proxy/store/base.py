"""What every part of the store shares: reads and transactions that fail as `StoreError`, UTC time.

Timestamps are stored in UTC; SQLite hands them back naive, so they are made aware again on read.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from art_proxy.errors import StoreError
from art_proxy.records import GroupRecord, JsonObject
from art_proxy.store import schema

log = logging.getLogger(__name__)
Record = TypeVar("Record", bound=BaseModel)


@dataclass(frozen=True)
class GroupPosition:
    """A place in the groups' order, oldest first: a page of groups starts after it."""

    created_at: datetime
    id: str


def after_position(
    page: sa.Select[Any], position: GroupPosition | GroupRecord | None
) -> sa.Select[Any]:
    """`page` (of groups, oldest first) from just after `position`, as a range the groups'
    `(created_at, id)` index seeks to."""
    if position is None:
        return page
    groups = schema.groups
    return page.where(
        groups.c.created_at >= position.created_at,
        sa.or_(groups.c.created_at > position.created_at, groups.c.id > position.id),
    )


def group_split() -> sa.ColumnElement[Any]:
    """A group's split, aggregated over its trajectories (joined or correlated as the
    `trajectories` table): `eval` when any member is, else `val` when any member is, so a group
    that mixes splits (one stored before automatic groups were keyed by split, or an explicit
    group given both) is only ever read for what its held-out member is, never trained on."""
    trajectories = schema.trajectories

    def any_member(split: str) -> sa.ColumnElement[bool]:
        return sa.func.sum(sa.case((trajectories.c.split == split, 1), else_=0)) > 0

    return sa.case(
        (any_member("eval"), "eval"),
        (any_member("val"), "val"),
        else_=sa.func.min(trajectories.c.split),
    )


def not_an_evaluation() -> sa.ColumnElement[bool]:
    """The group (`groups`) has no member of an `art-proxy eval` run: an evaluation's groups are
    judged by the evaluation itself (its arms side by side) and never trained on. Its members
    are read under an alias of their own, so a query that joins `trajectories` already (the
    finished groups') correlates only `groups`."""
    member = schema.trajectories.alias("evaluated_member")
    return ~sa.exists().where(
        member.c.group_id == schema.groups.c.id, member.c.split.concat("") == "eval"
    )


def is_split(split: str) -> sa.ColumnElement[bool]:
    """A trajectory's split is `split`, written as `split || ''` so that no index serves it, for
    a query that finds trajectories by another index (their group's, their scenario's): without
    statistics (none unless someone runs ANALYZE) SQLite's planner took
    `ix_trajectories_split_status_created` for `split = ?` and read every trajectory of the split
    for each group or scenario it looked at."""
    return schema.trajectories.c.split.concat("") == split


def has_member(*conditions: sa.ColumnElement[bool]) -> sa.Exists:
    """Whether the group (`groups`) a query reads has a trajectory meeting `conditions`, found
    through the group's index: no condition may be one another index serves (see `is_split`)."""
    return sa.exists().where(schema.trajectories.c.group_id == schema.groups.c.id, *conditions)


def counted_page(page: sa.Select[Any], *more: sa.Label[Any], newest_first: bool) -> sa.Select[Any]:
    """`page` (a select of groups, ordered and limited) with each group's `group_counts` and any
    `more` aggregates over its trajectories: its members are counted once the page is chosen, not
    every group's before (which took 200 ms a page beside 100,000 groups)."""
    chosen = page.subquery("page")
    created = chosen.c.created_at.desc() if newest_first else chosen.c.created_at.asc()
    return (
        sa.select(chosen, *group_counts(), *more)
        .join(schema.trajectories, schema.trajectories.c.group_id == chosen.c.id)
        .group_by(*chosen.c)
        .order_by(created, chosen.c.id)
    )


def group_counts() -> list[sa.Label[Any]]:
    """Aggregates over a group's trajectories (joined as the `trajectories` table)."""
    trajectories = schema.trajectories
    return [
        sa.func.count(trajectories.c.id).label("size"),
        sa.func.sum(sa.case((trajectories.c.status == "open", 1), else_=0)).label("open_count"),
        sa.func.max(trajectories.c.created_at).label("newest_started_at"),
    ]


def group_record(row: JsonObject) -> GroupRecord:
    return GroupRecord(
        id=row["id"],
        scenario_id=row["scenario_id"],
        created_at=aware(row["created_at"]),
        size=int(row["size"]),
        open_count=int(row["open_count"] or 0),
        newest_started_at=aware(row["newest_started_at"]),
    )


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


# What a database that cannot be reached raises: SQLAlchemy's errors, and the socket's own while a
# connection is being made (asyncpg's connect lets ConnectionRefusedError and the like through).
DATABASE_ERRORS = (SQLAlchemyError, OSError, TimeoutError)
# PostgreSQL's "the database system is starting up" (or shutting down): a server on its way back.
_CANNOT_CONNECT_NOW = "57P03"


def store_unreachable(error: StoreError) -> bool:
    """Whether `error` says the store could not be reached (refused, reset, timed out, a server
    starting up) rather than refusing what was asked (no such database, role or password)."""
    cause = error.__cause__
    if isinstance(cause, (OSError, TimeoutError)):
        return True
    return getattr(getattr(cause, "orig", None), "sqlstate", None) == _CANNOT_CONNECT_NOW


class StoreBase:
    engine: AsyncEngine
    unreadable_rows: int  # rows `_readable` skipped, since the store opened (on /health)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection]:
        """A transaction whose database errors, inside the block too, become `StoreError`."""
        try:
            async with self.engine.begin() as connection:
                yield connection
        except DATABASE_ERRORS as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc

    async def _first(self, query: sa.Select[Any]) -> JsonObject | None:
        rows = await self._all(query)
        return rows[0] if rows else None

    async def _all(self, query: sa.Select[Any]) -> list[JsonObject]:
        try:
            async with self.engine.connect() as connection:
                result = await connection.execute(query)
                # Keys read once: a mapping per row looked them up again for each (half the cost
                # of housekeeping's 1,700 active groups a second under load)
                keys = list(result.keys())
                return [dict(zip(keys, row, strict=True)) for row in result]
        except DATABASE_ERRORS as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc

    def _readable(self, make: Callable[..., Record], row: JsonObject, *args: Any) -> Record | None:
        """`make(row, *args)`, or None for a row that is not a valid record (written by an older
        version, or by hand): readers skip it, count it (`unreadable_rows`, on /health) and log
        it, so one bad row never makes a whole list unreadable."""
        try:
            return make(row, *args)
        except ValidationError as exc:
            self.unreadable_rows += 1
            log.warning(
                "skipped unreadable row %r (%d so far): %s",
                row.get("id"),
                self.unreadable_rows,
                exc.errors(include_url=False, include_input=False),
            )
            return None
