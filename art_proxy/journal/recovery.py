"""What an earlier run left in a journal slot, read back at start: each segment's whole frames,
its torn tail skipped (a process killed mid-append), damaged spans between whole frames copied to
the quarantine and skipped, each counted (`JournalStats`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .frames import survey
from .quarantine import QUARANTINE

log = logging.getLogger(__name__)


@dataclass
class Segment:
    order: int
    path: Path
    end: int  # bytes of whole frames: written so far (live), or found by the scan (recovered)
    frames: int
    recovered: bool  # written by an earlier run: its frames may already be in the store
    live: bool = False  # this proxy appends to it
    read_fd: int | None = None
    # Damaged spans `(start, end)` a recovery found between whole frames (quarantined, skipped).
    holes: list[tuple[int, int]] = field(default_factory=list)

    def pread(self, length: int, offset: int) -> bytes:
        if self.read_fd is None:
            self.read_fd = os.open(self.path, os.O_RDONLY)
        return os.pread(self.read_fd, length, offset)

    def whole(self, offset: int, length: int) -> bytes | None:
        """`length` bytes at `offset` of the segment's whole frames, or None past them."""
        return self.pread(length, offset) if offset + length <= self.end else None

    def next_hole(self, offset: int) -> tuple[int, int] | None:
        return next((hole for hole in self.holes if hole[1] > offset), None)

    def close(self) -> None:
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None


@dataclass
class JournalStats:
    torn_frames: int = 0  # torn frames found in recovered segments (each skipped, never ingested)
    damaged_spans: int = 0  # damaged bytes between whole frames (quarantined, skipped)
    damaged_records: int = 0  # records those spans held, by the frames' sequence numbers


def recover(
    path: Path, order: int, previous_seq: int | None, directory: Path, stats: JournalStats
) -> tuple[Segment | None, int | None]:
    """A segment an earlier run left: its whole frames, read a window at a time; a torn tail
    (a process killed mid-append) is skipped, damaged spans between whole frames are copied to
    the journal's quarantine and skipped, each counted. Returns the segment (None: no frame)
    and its last frame's sequence number."""
    fd = os.open(path, os.O_RDONLY)
    try:
        found = survey(lambda offset, length: os.pread(fd, length, offset), os.fstat(fd).st_size)
        for damage in found.damage:
            kept = _quarantine(fd, path, damage.start, damage.end, directory)
            stats.damaged_spans += 1
            stats.damaged_records += damage.lost
            log.error(
                "journal %s: %d damaged bytes at offset %d (about %d records) are skipped; "
                "copied to %s",
                path,
                damage.end - damage.start,
                damage.start,
                damage.lost,
                kept,
            )
    finally:
        os.close(fd)
    if found.torn:
        stats.torn_frames += 1
        log.error(
            "journal %s: a torn frame (%d bytes after %d whole frames, a process killed "
            "mid-append) is skipped",
            path,
            found.torn,
            found.frames,
        )
    if not found.frames:
        path.unlink()
        return None, found.last_seq
    holes = [(damage.start, damage.end) for damage in found.damage]
    segment = Segment(order, path, found.end, found.frames, recovered=True, holes=holes)
    return segment, found.last_seq


def _quarantine(fd: int, path: Path, start: int, end: int, directory: Path) -> Path:
    """Copy a segment's damaged bytes beside the journal, for a person (or a tool) to look at:
    the segment itself is deleted once ingested. Best effort: a disk that refuses the copy
    costs the copy only."""
    kept = directory / QUARANTINE / f"{path.parent.name}-{path.stem}-{start}.bytes"
    try:
        kept.parent.mkdir(exist_ok=True)
        with open(kept, "wb") as file:
            for offset in range(start, end, 2**20):
                file.write(os.pread(fd, min(2**20, end - offset), offset))
    except OSError as exc:
        log.error("journal %s: the damaged bytes could not be copied: %s", path, exc)
    return kept
