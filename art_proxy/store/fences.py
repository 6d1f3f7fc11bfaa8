"""Erasure fences: an erased subject's records that arrive after its erasure are dropped.

Erasure deletes what the store holds, but records of the subject may still be on their way: a
call in flight while `forget` runs is recorded after it, and another proxy's journal (it was cut
off from the store, or is behind) ingests the subject's calls whenever it catches up. Either would
undo the erasure. So erasure fences the subject (its user or tenant) and every trajectory it
deletes before it deletes anything: while it runs the fence is up (`FENCE_UP`: every record of
them is dropped); when it ends the fence is set to its end, so a record whose call began before
the erasure finished is dropped whenever and wherever it arrives (a proxy's writer, a journal's
ingester, `journal replay`), and a call begun after it (the user came back) is recorded as any.
Times are the proxies' clocks: keep them in step (NTP), as the store's ordering already assumes.

Fences are keyed by a hash of what they name, never the id (the id is what was erased), and kept:
a backlog may arrive any time later. The check is one indexed lookup a transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from art_proxy.records import SubjectSelector
from art_proxy.records.trajectories import BEST_OF, SHADOW_OF
from art_proxy.store import schema
from art_proxy.store.rows import Batch, CallRow, RowKind, TouchRow, TrajectoryRow

FENCES = schema.erasure_fences
# While an erasure runs: every record of the subject is dropped, whenever its call began.
FENCE_UP = datetime(9999, 1, 1, tzinfo=UTC)


def fence_key(kind: str, value: str) -> str:
    """The key of the fence on a user, a tenant or a trajectory (a user's or tenant's id as
    stored: `stored_subject_id`)."""
    return hashlib.blake2b(f"{kind}\0{value}".encode(), digest_size=16).hexdigest()


def subject_keys(subject: SubjectSelector) -> list[str]:
    return [
        fence_key(kind, value)
        for kind in ("user", "tenant", "trajectory")
        if (value := getattr(subject, kind)) is not None
    ]


def trajectory_keys(trajectory_ids: Iterable[str]) -> list[str]:
    return [fence_key("trajectory", trajectory_id) for trajectory_id in trajectory_ids]


@dataclass(frozen=True)
class Fence:
    """Records of what it names whose call began before `before` are dropped."""

    before: datetime
    erasure: str  # the erasure that put it up (see `unfenced`)


@dataclass(frozen=True)
class _Arrival:
    """What a batch records: the fences that would name it, and when its call began."""

    keys: tuple[str, ...]
    trajectories: tuple[str, ...]  # the keys of its trajectories, among `keys`
    began: datetime
    # The keys of the trajectories whose words a shadow sample or best-of candidate of it holds
    # (its metadata names them), among `keys`: fenced, they drop it whenever its call began.
    origins: tuple[str, ...] = ()


def _arrival(batch: Batch) -> _Arrival | None:
    keys: list[str] = []
    trajectories: list[str] = []
    origins: list[str] = []
    began: datetime | None = None
    for kind, row in batch.rows:
        if kind is RowKind.trajectory:
            trajectory = cast(TrajectoryRow, row)
            trajectories.append(fence_key("trajectory", trajectory["id"]))
            metadata = trajectory.get("metadata") or {}
            origins += [
                fence_key("trajectory", str(metadata[marker]))
                for marker in (SHADOW_OF, BEST_OF)
                if metadata.get(marker)
            ]
            subjects = (
                ("user", trajectory.get("user_id")),
                ("tenant", trajectory.get("tenant_id")),
            )
            keys += [fence_key(named, value) for named, value in subjects if value is not None]
            began = began or trajectory["created_at"]
        elif kind is RowKind.call:
            call = cast(CallRow, row)
            trajectories.append(fence_key("trajectory", call["trajectory_id"]))
            began = call["created_at"] if began is None else min(began, call["created_at"])
        elif kind is RowKind.touch:
            trajectories.append(fence_key("trajectory", cast(TouchRow, row)["b_id"]))
    if began is None or not (keys or trajectories):
        return None
    return _Arrival((*keys, *trajectories, *origins), tuple(trajectories), began, tuple(origins))


def unfenced(connection: sa.Connection, batches: Sequence[Batch]) -> list[Batch]:
    """`batches` without those an erasure fenced (see the module), read in the writer's
    transaction: an erasure's fence is committed before its deletions, so a batch either is read
    against the fence or lands before the deletions that take it away.

    A dropped batch's trajectories are fenced as the fence that dropped it: a trajectory the
    store never held (a backlog's) is named by its user only in its first call's record, and its
    later calls must go the same way."""
    arrivals = [_arrival(batch) for batch in batches]
    keys = sorted({key for arrival in arrivals if arrival is not None for key in arrival.keys})
    if not keys:
        return list(batches)
    fences = _fences(connection, keys)
    if not fences:
        return list(batches)
    kept: list[Batch] = []
    derived: dict[str, Fence] = {}
    for batch, arrival in zip(batches, arrivals, strict=True):
        matched = None if arrival is None else _matched(arrival, fences | derived)
        if matched is None:
            kept.append(batch)
            continue
        assert arrival is not None  # matched
        for key in arrival.trajectories:
            if key not in fences:
                derived.setdefault(key, matched)
    if derived:
        put(connection, derived)
    return kept


def names_an_erased_trajectory(connection: sa.Connection, batch: Batch) -> bool:
    """Whether `batch` records a trajectory an erasure fenced, whenever its call began. Asked of
    a batch the store refused: its trajectory is gone (erased, or dropped on arrival while its
    proxy went on with it), so it could only ever be set aside, holding erased words."""
    arrival = _arrival(batch)
    return arrival is not None and bool(_fences(connection, list(arrival.trajectories)))


def _matched(arrival: _Arrival, fences: dict[str, Fence]) -> Fence | None:
    """The fence that drops `arrival`, if one does (the latest, if several)."""
    named = [fence for key in arrival.keys if (fence := fences.get(key)) is not None]
    dropping = [fence for fence in named if arrival.began < fence.before]
    # Drawn from words an erasure took (after their call was answered, so perhaps after it).
    dropping += [fence for key in arrival.origins if (fence := fences.get(key)) is not None]
    return max(dropping, key=lambda fence: fence.before) if dropping else None


def put(connection: sa.Connection, fences: dict[str, Fence], *, replace: bool = False) -> None:
    """Fences added; where one is up already it stays as it is, or with `replace` (an erasure
    putting up its own) it becomes the new one."""
    if not fences:
        return
    insert = (postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert)(
        FENCES
    )
    rows = [
        {"key": key, "fenced_before": fence.before, "erasure": fence.erasure}
        for key, fence in fences.items()
    ]
    statement = (
        insert.on_conflict_do_update(
            index_elements=[FENCES.c.key],
            set_={
                "fenced_before": insert.excluded.fenced_before,
                "erasure": insert.excluded.erasure,
            },
        )
        if replace
        else insert.on_conflict_do_nothing()
    )
    connection.execute(statement, rows)


def close(connection: sa.Connection, erasure: str, before: datetime) -> None:
    """The fences `erasure` put up (and those derived from them) set to `before`: its end."""
    connection.execute(
        sa.update(FENCES).where(FENCES.c.erasure == erasure).values(fenced_before=before)
    )


def _fences(connection: sa.Connection, keys: list[str]) -> dict[str, Fence]:
    """The fences on `keys`: on SQLite through the sqlite3 cursor (the writer's hot path, see
    writer.py), elsewhere through SQLAlchemy."""
    found: dict[str, Fence] = {}
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        if connection.dialect.name == "sqlite":
            cursor = connection.connection.cursor()
            try:
                marks = ",".join("?" * len(chunk))
                cursor.execute(
                    "SELECT key, fenced_before, erasure FROM erasure_fences "
                    f"WHERE key IN ({marks})",
                    chunk,
                )
                rows = [(key, _sqlite_time(before), by) for key, before, by in cursor.fetchall()]
            finally:
                cursor.close()
        else:
            query = sa.select(FENCES.c.key, FENCES.c.fenced_before, FENCES.c.erasure).where(
                FENCES.c.key.in_(chunk)
            )
            rows = [(row.key, row.fenced_before, row.erasure) for row in connection.execute(query)]
        found.update((key, Fence(before, erasure)) for key, before, erasure in rows)
    return found


def _sqlite_time(value: str) -> datetime:
    """A Timestamp as SQLite keeps it (UTC, its zone dropped: writer.py's `_sqlite_datetime`)."""
    return datetime.fromisoformat(value).replace(tzinfo=UTC)
