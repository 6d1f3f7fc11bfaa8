"""Self-checking frames: a record on disk is a magic, its length, its sequence number, a CRC-32
over all three and the payload, then the payload.

A process killed mid-append leaves a torn last frame (a short header, a short payload, or bytes
whose checksum does not match), a crash of the machine possibly zeros; a scan stops there and
never hands half a record on. Damage in the middle of a file (a flipped bit, a lost page) is
not the end of it: `survey` resynchronises at the next magic that starts a whole frame, and the
sequence numbers on either side say how many records the damaged bytes held. Payloads are never
empty (zeros are not frames) and never over `MAX_PAYLOAD` (a damaged length is not a reason to
read gigabytes).

Files written before frames carried a magic (`LEGACY`: length and CRC-32 of the payload only)
are still read, frame by frame; they cannot be resynchronised, so damage there ends the file.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

MAGIC = b"APJ2"
# magic, payload length, sequence number, CRC-32 of (length, sequence number, payload)
HEADER = struct.Struct("<4sIQI")
LEGACY = struct.Struct("<II")  # payload length, CRC-32 of the payload
_CHECKED = slice(len(MAGIC), HEADER.size - 4)  # the header's bytes under the checksum
# A record is one call: far below this (requests are bounded by --max-body-mb, 32 MiB by default).
MAX_PAYLOAD = 256 * 2**20
_WINDOW = 2**20  # how much of a file `survey` reads at a time

# `(offset, length)` -> those bytes, or None where the file ends first.
Reader = Callable[[int, int], "bytes | memoryview | None"]


def header(payload: bytes, seq: int) -> bytes:
    checked = struct.pack("<IQ", len(payload), seq)
    return MAGIC + checked + struct.pack("<I", zlib.crc32(payload, zlib.crc32(checked)))


def frame_bytes(payload: bytes, seq: int) -> bytes:
    return header(payload, seq) + payload


@dataclass(frozen=True)
class Frame:
    start: int  # offset of the frame's header in its file
    end: int  # offset just past its payload
    payload: bytes
    seq: int | None  # None: a legacy frame


@dataclass
class Scan:
    """What a pass over a buffer found: whole frames, and where the good bytes end."""

    frames: list[Frame]
    end: int  # offset after the last whole frame
    torn: bool  # bytes after `end` that are not a whole frame (only meaningful at a file's end)


def parse(read: Reader, position: int) -> Frame | None:
    """The whole frame at `position`, or None if the bytes there are not one."""
    magic = read(position, len(MAGIC))
    if magic is None:
        return None
    if bytes(magic) == MAGIC:
        fields = read(position, HEADER.size)
        if fields is None:
            return None
        _, length, seq, checksum = HEADER.unpack(fields)
        start = position + HEADER.size
        checked: bytes | memoryview | None = fields[_CHECKED]
    else:
        fields = read(position, LEGACY.size)
        if fields is None:
            return None
        length, checksum = LEGACY.unpack(fields)
        seq, start, checked = None, position + LEGACY.size, None
    if not 0 < length <= MAX_PAYLOAD:
        return None
    payload = read(start, length)
    if payload is None:
        return None
    expected = zlib.crc32(payload) if checked is None else zlib.crc32(payload, zlib.crc32(checked))
    if expected != checksum:
        return None
    return Frame(position, start + length, bytes(payload), seq)


def buffer_reader(buffer: bytes | memoryview) -> Reader:
    view = memoryview(buffer)

    def read(offset: int, length: int) -> memoryview | None:
        return view[offset : offset + length] if offset + length <= len(view) else None

    return read


def scan(buffer: bytes | memoryview, base: int = 0, *, max_frames: int | None = None) -> Scan:
    """The whole frames at the start of `buffer` (which begins at offset `base` in its file), up
    to `max_frames`. A frame cut by the buffer's end, or failing its checksum, ends the scan."""
    read = buffer_reader(buffer)
    frames: list[Frame] = []
    position = 0
    while position < len(buffer) and (max_frames is None or len(frames) < max_frames):
        frame = parse(read, position)
        if frame is None:
            return Scan(frames, base + position, True)
        frames.append(Frame(base + frame.start, base + frame.end, frame.payload, frame.seq))
        position = frame.end
    return Scan(frames, base + position, False)


def scan_past_damage(buffer: bytes | memoryview) -> tuple[list[Frame], list[tuple[int, int]]]:
    """Every whole frame of `buffer`, resynchronising past bytes that are not frames (a frame a
    full disk cut short, with whole ones appended after it); and those bytes' spans."""
    window = _Window(buffer_reader(buffer), len(buffer))
    frames: list[Frame] = []
    damaged: list[tuple[int, int]] = []
    position = 0
    while position < len(buffer):
        frame = parse(window.read, position)
        if frame is None:
            frame = _resync(window, position + 1, len(buffer))
            damaged.append((position, len(buffer) if frame is None else frame.start))
            if frame is None:
                break
        frames.append(frame)
        position = frame.end
    return frames, damaged


@dataclass(frozen=True)
class Damage:
    """Bytes in the middle of a file that are not frames, with whole frames after them."""

    start: int
    end: int
    lost: int  # records the bytes held, by the sequence numbers on either side (at least 1)


@dataclass
class Survey:
    """A file read through once: how many whole frames, where they end, what is damaged."""

    frames: int = 0
    end: int = 0  # offset after the last whole frame
    torn: int = 0  # bytes after `end` that are not a whole frame
    damage: list[Damage] = field(default_factory=list)
    last_seq: int | None = None


def survey(read: Reader, size: int, previous_seq: int | None = None) -> Survey:
    """Every whole frame of a file of `size` bytes, read a window at a time (never whole),
    resynchronising past damage. `previous_seq`: the sequence number of the frame before the
    file's first (the slot's previous file), for counting what damage at its start held."""
    window = _Window(read, size)
    found = Survey(last_seq=previous_seq)
    position = 0
    while position < size:
        frame = parse(window.read, position)
        if frame is None:
            resumed = _resync(window, position + 1, size)
            if resumed is None:
                found.torn = size - position
                break
            lost = 1
            if resumed.seq is not None and found.last_seq is not None:
                lost = max(1, resumed.seq - found.last_seq - 1)
            found.damage.append(Damage(position, resumed.start, lost))
            frame = resumed
        found.frames += 1
        found.end = position = frame.end
        found.last_seq = frame.seq if frame.seq is not None else found.last_seq
    return found


def _resync(window: _Window, position: int, size: int) -> Frame | None:
    """The first whole frame at or after `position` that begins with the magic."""
    while position < size:
        chunk = window.read(position, min(_WINDOW, size - position))
        assert chunk is not None
        at = bytes(chunk).find(MAGIC)
        if at < 0:
            # A magic cut by the chunk's end is found by the next chunk.
            position += max(1, len(chunk) - len(MAGIC) + 1)
            continue
        frame = parse(window.read, position + at)
        if frame is not None:
            return frame
        position += at + 1
    return None


class _Window:
    """Reads of a file through one buffer of about `_WINDOW` bytes."""

    def __init__(self, read: Reader, size: int) -> None:
        self._read, self._size = read, size
        self._start, self._buffer = 0, memoryview(b"")

    def read(self, offset: int, length: int) -> memoryview | None:
        if offset + length > self._size:
            return None
        if not (self._start <= offset and offset + length <= self._start + len(self._buffer)):
            got = self._read(offset, min(max(length, _WINDOW), self._size - offset))
            if got is None or len(got) < length:
                return None
            self._start, self._buffer = offset, memoryview(got)
        return self._buffer[offset - self._start : offset - self._start + length]
