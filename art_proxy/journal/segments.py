"""The journal on disk: a directory of slots, each a proxy's append-only segment files.

A proxy takes the first slot it can lock (`flock`), so several proxies on one host share a journal
directory; a slot whose lock is free belongs to a proxy that died, and the next proxy to start
adopts it and ingests what it left. Frames are appended from the event loop, each with one
`writev`: once it returns the record is in the kernel and survives the process being killed. Durability `power` adds a group-committed `fdatasync` (one thread hop covers every
frame appended before it).

Positions are `(segment order, offset)`: segments are read in the order they were recovered or
created, and a segment is deleted once the ingester has moved past its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from art_proxy.config import Durability
from art_proxy.errors import ConfigError, JournalError

from .directory import (
    SEGMENT_SUFFIX,
    Slot,
    claim_for_store,
    fsync_directory,
    remove_if_empty,
    remove_if_unused,
    sync_directories,
    sync_segments,
    take_slots,
)
from .frames import HEADER, MAX_PAYLOAD, Frame, Scan, header, parse, scan
from .recovery import JournalStats, Segment, recover

log = logging.getLogger(__name__)

# A live segment is closed past this size; the ingester deletes closed segments it has passed.
SEGMENT_BYTES = 16 * 1024 * 1024

Position = tuple[int, int]  # (segment order, offset)


@dataclass(frozen=True)
class PendingFrame:
    frame: Frame
    end: Position
    recovered: bool


@dataclass
class Journal:
    directory: Path
    durability: Durability
    _own: Slot
    _adopted: list[Slot]
    _segments: list[Segment]  # unconsumed, in reading order; the last one is live
    _write_fd: int = -1
    # The live segment takes no more frames: it ends in a partial frame it could not cut back, or
    # an fdatasync of it failed (the kernel may have dropped pages a later sync would not cover).
    _abandoned: bool = False
    _next_number: int = 0  # the next live segment's file number in the own slot
    _next_seq: int = 0  # the next frame's sequence number (after every recovered frame's)
    _cursor: Position = (0, 0)  # everything before it is in the store
    _frames_total: int = 0
    _backlog_bytes: int = 0  # appended and not yet consumed, kept for the bound on appends
    max_backlog_bytes: int = 0  # 0: none but the disk's
    _frames_consumed: int = 0
    _synced: Position = (0, 0)
    # Under power, what the next group commit syncs besides the live segment, off the event
    # loop: segments rotated out (their descriptors, kept open until then), and the own slot's
    # directory once a new segment's name is in it.
    _unsynced_fds: list[int] = field(default_factory=list)
    _directory_unsynced: bool = False
    _deleted_in: set[Path] = field(default_factory=set)  # under power: to sync (`consume`)
    _sync_waiters: list[tuple[Position, asyncio.Future[None]]] = field(default_factory=list)
    _sync_task: asyncio.Task[None] | None = None
    _advanced: asyncio.Event = field(default_factory=asyncio.Event)
    appended: asyncio.Event = field(default_factory=asyncio.Event)
    # Set by a reader waiting for the ingester: it stops lingering for more frames.
    wanted: asyncio.Event = field(default_factory=asyncio.Event)
    stats: JournalStats = field(default_factory=JournalStats)

    # --- opening and closing -------------------------------------------------------------------

    @classmethod
    def open(
        cls, directory: Path, store: str, durability: Durability, max_backlog_bytes: int = 0
    ) -> Journal:
        """Take a slot in `directory` (created if missing) for a proxy of `store`, and adopt the
        slots of proxies that died; `ConfigError` if the directory cannot serve. Past
        `max_backlog_bytes` waiting for the store (0: no bound but the disk's), appends fail."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
            claim_for_store(directory, store)
            own, adopted = take_slots(directory)
            if durability is Durability.power:
                # The names just created (the directory, its store file, the slot and its lock)
                # survive a power loss only once their directories are synced.
                for created in (directory.parent, directory, own.path):
                    fsync_directory(created)
        except OSError as exc:
            raise ConfigError(f"journal {directory}: {exc.strerror or exc}") from exc
        stats = JournalStats()
        segments: list[Segment] = []
        next_seq = 0
        for slot in [*adopted, own]:
            last_seq: int | None = None
            for path in sorted(slot.path.glob("*" + SEGMENT_SUFFIX)):
                segment, last_seq = recover(path, len(segments), last_seq, directory, stats)
                if segment is not None:
                    segments.append(segment)
            next_seq = max(next_seq, -1 if last_seq is None else last_seq + 1)
        numbers = [
            int(path.stem) for path in own.path.glob("*" + SEGMENT_SUFFIX) if path.stem.isdigit()
        ]
        journal = cls(directory, durability, own, adopted, segments, stats=stats)
        journal.max_backlog_bytes = max_backlog_bytes
        journal._next_seq = next_seq
        journal._frames_total = sum(segment.frames for segment in segments)
        journal._backlog_bytes = sum(segment.end for segment in segments)
        journal._next_number = max(numbers, default=-1) + 1
        if segments:
            journal._cursor = (segments[0].order, 0)
            log.warning(
                "journal %s: %d records of an earlier run (%.1f MB) are ingested first",
                directory,
                journal._frames_total,
                sum(segment.end for segment in segments) / 1e6,
            )
        try:
            journal._open_live_segment()
        except OSError as exc:
            journal.close()
            raise ConfigError(f"journal {directory}: {exc.strerror or exc}") from exc
        return journal

    def close(self) -> int:
        """Release the journal; returns how many frames were left for the next start to ingest.
        A journal left empty removes its files."""
        left = self.backlog_frames
        if self._write_fd >= 0:
            if self.durability is Durability.power:
                rotated, directory = self._take_unsynced()
                with contextlib.suppress(OSError):
                    sync_segments(rotated, directory, os.dup(self._write_fd))
            os.close(self._write_fd)
            self._write_fd = -1
        for segment in self._segments:
            segment.close()
            if left == 0:
                segment.path.unlink(missing_ok=True)
        for slot in [*self._adopted, self._own]:
            if left == 0 or slot is not self._own:
                remove_if_empty(slot)
            os.close(slot.lock_fd)
        if left == 0:
            remove_if_unused(self.directory)
        return left

    # --- appending -----------------------------------------------------------------------------

    def append(self, payload: bytes) -> Position:
        """Append one frame; returns the position after it, or raises `JournalError` if the disk
        refused it (the segment cut back to its last whole frame).

        Written at once, not gathered with the other frames of the loop's turn into one `writev`:
        that saved system calls under load (28 us each on a sandboxed kernel), but each call then
        waited two more turns of the loop, which cost more (measured: 0.1 ms of a call's added
        latency; the CPU a call at 16 in flight did not change beyond the noise)."""
        live = self._segments[-1]
        size = HEADER.size + len(payload)
        if not 0 < len(payload) <= MAX_PAYLOAD:
            raise JournalError(f"a record of {len(payload)} bytes cannot be journaled")
        if self.max_backlog_bytes and self._backlog_bytes + size > self.max_backlog_bytes:
            raise JournalError(
                f"journal {self.directory} is full: {self._backlog_bytes / 2**20:.1f} MiB wait "
                f"for the store (--journal-max-mb {self.max_backlog_bytes / 2**20:g})"
            )
        if self._abandoned or (live.end > 0 and live.end + size > SEGMENT_BYTES):
            try:
                self._rotate()
            except OSError as exc:  # the live segment stays: the next append tries again
                raise JournalError(f"journal {self.directory}: {exc.strerror or exc}") from exc
            live = self._segments[-1]
        try:
            parts = [header(payload, self._next_seq), payload]
            done = os.writev(self._write_fd, parts)
            if done < size:  # a short write (a signal, a nearly full disk): finish it
                rest = b"".join(parts)[done:]
                while rest:
                    rest = rest[os.write(self._write_fd, rest) :]
        except OSError as exc:
            self._cut_back(live)
            raise JournalError(f"journal {self.directory}: {exc.strerror or exc}") from exc
        self._next_seq += 1
        live.end += size
        live.frames += 1
        self._frames_total += 1
        self._backlog_bytes += size
        self.appended.set()
        return (live.order, live.end)

    async def synced(self, position: Position) -> None:
        """Return once `position` is on disk (durability `power`; at once for `process`)."""
        if self.durability is Durability.process or position <= self._synced:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._sync_waiters.append((position, waiter))
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.create_task(self._sync(), name="art-proxy-journal-sync")
        await waiter

    async def _sync(self) -> None:
        """Group commit: one pass covers every frame appended before it began (the segments
        rotated out since the last pass, the slot's directory if a segment was created, then
        the live segment), in a worker thread."""
        loop = asyncio.get_running_loop()
        while self._sync_waiters:
            live = self._segments[-1]
            target = (live.order, live.end)
            rotated, directory = self._take_unsynced()
            # A duplicate descriptor: the live one may be closed by a rotation meanwhile.
            fd = os.dup(self._write_fd)
            try:
                await loop.run_in_executor(None, sync_segments, rotated, directory, fd)
            except OSError as exc:
                self._abandoned = True
                error = JournalError(f"journal {self.directory}: fdatasync: {exc}")
                for _, waiter in self._sync_waiters:
                    if not waiter.done():
                        waiter.set_exception(error)
                self._sync_waiters.clear()
                return
            self._synced = max(self._synced, target)
            still = []
            for position, waiter in self._sync_waiters:
                if position <= self._synced:
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    still.append((position, waiter))
            self._sync_waiters = still

    def _take_unsynced(self) -> tuple[list[int], Path | None]:
        rotated, self._unsynced_fds = self._unsynced_fds, []
        directory = self._own.path if self._directory_unsynced else None
        self._directory_unsynced = False
        return rotated, directory

    def _rotate(self) -> None:
        """Move appends to a new segment. The new one opens before the old one is let go: a
        disk that refuses the new file (full, out of inodes) leaves the old one live, and a
        later append tries again once there is room. Under power the old one is synced by the
        next group commit (every append under power waits for one), not here on the loop."""
        old, old_fd = self._segments[-1], self._write_fd
        self._open_live_segment()
        self._abandoned = False
        old.live = False
        if self.durability is Durability.power:
            self._unsynced_fds.append(old_fd)
        else:
            os.close(old_fd)

    def _open_live_segment(self) -> None:
        order = self._segments[-1].order + 1 if self._segments else 0
        path = self._own.path / f"{self._next_number:012d}{SEGMENT_SUFFIX}"
        self._write_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._next_number += 1
        if self.durability is Durability.power:
            self._directory_unsynced = True  # the new file's name survives a power loss once synced
        self._segments.append(Segment(order, path, 0, 0, recovered=False, live=True))
        if len(self._segments) == 1:
            self._cursor = (order, 0)

    def _cut_back(self, live: Segment) -> None:
        """After a failed append: drop its partial bytes, or start a new segment if even that
        fails, so no later frame follows a torn one (until one opens, appends are refused)."""
        try:
            os.ftruncate(self._write_fd, live.end)
            os.lseek(self._write_fd, live.end, os.SEEK_SET)
        except OSError:
            self._abandoned = True
            with contextlib.suppress(OSError):
                self._rotate()

    # --- reading and consuming (the ingester) --------------------------------------------------

    def pending(self, max_frames: int, max_bytes: int) -> list[PendingFrame]:
        """The next whole frames after the cursor, in order, up to the limits (always at least
        one frame if any is pending, however large)."""
        found: list[PendingFrame] = []
        read = 0
        order, offset = self._cursor
        for segment in self._segments:
            if segment.order < order:
                continue
            start = offset if segment.order == order else 0
            while start < segment.end and len(found) < max_frames and read < max_bytes:
                hole = segment.next_hole(start)
                if hole is not None and hole[0] <= start:  # quarantined at recovery
                    start = hole[1]
                    continue
                limit = segment.end if hole is None else hole[0]
                chunk = segment.pread(min(max_bytes - read, limit - start), start)
                result = scan(chunk, start, max_frames=max_frames - len(found))
                if not result.frames:  # a frame longer than the chunk: read it whole
                    frame = parse(segment.whole, start)
                    if frame is None:  # the survey at start-up validated these bytes
                        raise JournalError(f"journal segment {segment.path} changed on disk")
                    result = Scan([frame], frame.end, torn=False)
                for frame in result.frames:
                    end = (segment.order, frame.end)
                    found.append(PendingFrame(frame, end, segment.recovered))
                read += result.end - start
                start = result.end
            if len(found) >= max_frames or read >= max_bytes:
                break
        return found

    def consume(self, end: Position, frames: int) -> None:
        """Everything before `end` (`frames` frames after the cursor) is in the store: move the
        cursor, and delete the segments it has left behind."""
        self._cursor = end
        self._frames_consumed += frames
        self._backlog_bytes = self.backlog_bytes  # a sum over the segments: once a transaction
        emptied: set[Path] = set()
        while self._segments:
            first = self._segments[0]
            if first.live or (first.order, first.end) > end:
                break
            first.close()
            first.path.unlink(missing_ok=True)
            emptied.add(first.path.parent)
            self._segments.pop(0)
            if self._segments:
                self._cursor = max(end, (self._segments[0].order, 0))
        if self.durability is Durability.power and emptied:
            # An unlink is durable once its directory is synced: the next sync does it, off the
            # event loop (`deletions_synced` at once, for erasure).
            self._deleted_in |= emptied
            self._directory_unsynced = True
        self._advanced.set()
        self._advanced = asyncio.Event()

    async def deletions_synced(self) -> None:
        """Under `power`: the directories of the segments deleted so far synced, in a thread, so
        the deletions survive a power loss (else one could bring back a segment an erasure
        deleted, and the next start would ingest what it erased)."""
        if self.durability is not Durability.power or not self._deleted_in:
            return
        directories, self._deleted_in = sorted(self._deleted_in), set()
        await asyncio.to_thread(sync_directories, directories)

    def seal(self) -> None:
        """Delete every segment whose records are all in the store, the live one too (appends
        move to a new one): erasure, once `settled`, leaves no byte of an ingested record on
        disk. A segment still holding records not ingested stays until they are."""
        if self._segments[-1].end:
            self._rotate()
        self.consume(self._cursor, 0)

    async def settled(self) -> None:
        """Return once everything appended before this call has been consumed (ingested)."""
        live = self._segments[-1]
        target = (live.order, live.end)
        while self._cursor < target:
            self.wanted.set()
            await self._advanced.wait()

    @property
    def backlog_frames(self) -> int:
        return self._frames_total - self._frames_consumed

    @property
    def backlog_bytes(self) -> int:
        order, offset = self._cursor
        return sum(segment.end for segment in self._segments if segment.order >= order) - offset

    @property
    def slot(self) -> Path:
        return self._own.path
