"""Records the store refused, set aside beside the journal: listed, put in again, or dropped.

The ingester appends a record the store refuses (a constraint, data it cannot take) to
`rejected-records` in the journal's directory, as frames, so that it cannot hold up the records
behind it. Once the cause is fixed (a trigger dropped, a column widened), `art-proxy journal
replay` commits them again; those the store still refuses stay, with its reason. Every change of
the file happens under an `flock` of its lock file, held only for the file's own reads and writes
(never across a commit): the ingester of a running proxy takes it too before it appends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from art_proxy.errors import StoreError
from art_proxy.privacy.private_files import open_private
from art_proxy.records import SubjectSelector
from art_proxy.store.rows import CallRow, RowKind, TrajectoryRow
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.store.writer import refuses_record

from .directory import fsync_directory
from .entries import Entry, decode
from .frames import frame_bytes, scan_past_damage

REJECTED_FILE = "rejected-records"
_LOCK_SUFFIX = ".lock"
# The file is rewritten whole when records leave it: no sequence for a reader to check.
_UNSEQUENCED = 0


@dataclass(frozen=True)
class SetAside:
    """One refused record: what it was, for a person deciding what to do with it."""

    payload: bytes
    entry: Entry | None  # None: not a readable entry (written so by a bug)

    @property
    def call(self) -> CallRow | None:
        if self.entry is None:
            return None
        rows = (row for kind, row in self.entry.batch.rows if kind is RowKind.call)
        return cast(CallRow | None, next(rows, None))


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[Path]:
    """The rejected-records file of `directory`, under its lock."""
    fd = os.open(directory / (REJECTED_FILE + _LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield directory / REJECTED_FILE
    finally:
        os.close(fd)  # releases the lock


def set_aside(directory: Path, payload: bytes) -> None:
    """Append one refused record (the ingester), on disk before it returns: the journal lets go
    of the record next. OSError if the disk refuses."""
    with _locked(directory) as path:
        created = not path.exists()
        with open_private(path, "ab") as file:
            whole = file.tell()
            try:
                file.write(frame_bytes(payload, _UNSEQUENCED))
                file.flush()
                os.fsync(file.fileno())
            except OSError:
                # Cut back to the last whole frame: a torn one would sit before every later
                # record (readers resynchronise past it all the same).
                with contextlib.suppress(OSError):
                    os.truncate(path, whole)
                raise
        if created:
            fsync_directory(directory)


def read(directory: Path) -> list[SetAside]:
    with _locked(directory) as path:
        return _read(path)


def count(directory: Path) -> int:
    """How many records are set aside (their frames, not decoded)."""
    if not (directory / REJECTED_FILE).exists():
        return 0
    with _locked(directory) as path:
        return len(scan_past_damage(path.read_bytes())[0])


def _read(path: Path) -> list[SetAside]:
    return _read_with_damage(path)[0]


def _read_with_damage(path: Path) -> tuple[list[SetAside], bytes]:
    """The whole records, read past damage, and the damaged bytes themselves."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], b""
    frames, damaged = scan_past_damage(data)
    records = [SetAside(frame.payload, _entry(frame.payload)) for frame in frames]
    return records, b"".join(data[start:end] for start, end in damaged)


def _entry(payload: bytes) -> Entry | None:
    try:
        return decode(payload)
    except ValueError:
        return None


@dataclass(frozen=True)
class Replayed:
    landed: int
    refused: list[tuple[SetAside, str]]  # with the store's reason


async def replay(directory: Path, store: TrajectoryStore) -> Replayed:
    """Commit each set-aside record again (by call id: one in the store already is not written
    twice); those that land leave the file. Raises the store's error when it cannot write at
    all (an outage is no verdict on the records: they all stay)."""
    landed: set[bytes] = set()
    refused: list[tuple[SetAside, str]] = []
    for record in read(directory):
        if record.entry is None:
            refused.append((record, "not a readable journal entry"))
            continue
        try:
            await store.writer.commit([record.entry.batch], skip_recorded=True)
        except Exception as exc:
            if not refuses_record(exc):
                raise StoreError(f"the store cannot write: {type(exc).__name__}: {exc}") from exc
            refused.append((record, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"))
        else:
            landed.add(record.payload)
    _keep(directory, lambda record: record.payload not in landed)
    return Replayed(len(landed), refused)


def drop(directory: Path) -> int:
    """Delete every set-aside record; how many there were."""
    return _keep(directory, lambda _record: False, keep_damage=False)


def drop_subject(directory: Path, subject: SubjectSelector, trajectory_ids: Collection[str]) -> int:
    """Delete the set-aside records of `subject` (erasure): those that create one of its
    trajectories, and the calls of those and of `trajectory_ids`; how many went. An unreadable
    record cannot be told apart and stays (`art-proxy journal drop` deletes every one)."""
    if not (directory / REJECTED_FILE).exists():
        return 0
    theirs = set(trajectory_ids)
    if subject.trajectory is not None:
        theirs.add(subject.trajectory)
    rows = [row for record in read(directory) if record.entry for row in record.entry.batch.rows]
    for kind, row in rows:
        if kind is RowKind.trajectory and _belongs(cast(TrajectoryRow, row), subject):
            theirs.add(cast(TrajectoryRow, row)["id"])

    def kept(record: SetAside) -> bool:
        if record.entry is None:
            return True
        return not any(
            cast(dict[str, object], row).get("trajectory_id" if kind is RowKind.call else "id")
            in theirs
            for kind, row in record.entry.batch.rows
            if kind in (RowKind.call, RowKind.trajectory)
        )

    return _keep(directory, kept)


def drop_older(directory: Path, before: float) -> int:
    """Delete the set-aside records journaled before `before` (epoch seconds: retention); how
    many went. An unreadable one has no date and stays."""
    if not (directory / REJECTED_FILE).exists():
        return 0
    return _keep(directory, lambda r: r.entry is None or r.entry.appended_at >= before)


def _belongs(row: TrajectoryRow, subject: SubjectSelector) -> bool:
    if subject.user is not None:
        return row.get("user_id") == subject.user
    if subject.tenant is not None:
        return row.get("tenant_id") == subject.tenant
    return row["id"] == subject.trajectory


def _keep(directory: Path, kept: Callable[[SetAside], bool], *, keep_damage: bool = True) -> int:
    """Rewrite the file with the records `kept` says stay (read again under the lock: the
    ingester may have appended since), atomically; remove it when none do. How many went."""
    with _locked(directory) as path:
        records, damaged = _read_with_damage(path)
        damaged = damaged if keep_damage else b""
        staying = [record for record in records if kept(record)]
        if not staying and not damaged:
            path.unlink(missing_ok=True)
            return len(records)
        partial = path.with_name(path.name + ".partial")
        with open_private(partial, "wb") as file:
            file.writelines(frame_bytes(r.payload, _UNSEQUENCED) for r in staying)
            # Bytes no reader could read are no verdict on what they held: they stay, after the
            # whole records (`art-proxy journal drop` removes them).
            file.write(damaged)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
        fsync_directory(directory)
        return len(records) - len(staying)
