"""Self-checking frames: a record on disk is its length, its CRC-32 and its bytes.

A process killed mid-append leaves a torn last frame (a short header, a short payload, or bytes
whose checksum does not match), a crash of the machine possibly zeros; a scan stops there, counts
it, and never hands half a record on. Payloads are never empty.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
MAX_PAYLOAD = 2**32 - 1  # what the length field holds


def header(payload: bytes) -> bytes:
    return HEADER.pack(len(payload), zlib.crc32(payload))


@dataclass(frozen=True)
class Frame:
    start: int  # offset of the frame's header in its segment
    end: int  # offset just past its payload
    payload: bytes


@dataclass
class Scan:
    """What a pass over a buffer found: whole frames, and where the good bytes end."""

    frames: list[Frame]
    end: int  # offset after the last whole frame
    torn: bool  # bytes after `end` that are not a whole frame (only meaningful at a file's end)


def scan(buffer: bytes | memoryview, base: int = 0, *, max_frames: int | None = None) -> Scan:
    """The whole frames at the start of `buffer` (which begins at offset `base` in its segment),
    up to `max_frames`. A frame cut by the buffer's end, or failing its checksum, ends the scan."""
    view = memoryview(buffer)
    frames: list[Frame] = []
    position = 0
    torn = False
    for frame in _frames(view):
        if max_frames is not None and len(frames) >= max_frames:
            break
        if frame is None:
            torn = True
            break
        length = len(frame)
        frames.append(Frame(base + position, base + position + HEADER.size + length, frame))
        position += HEADER.size + length
    else:
        torn = position < len(view)
    return Scan(frames, base + position, torn)


def _frames(view: memoryview) -> Iterator[bytes | None]:
    """Each whole frame's payload in turn; None for the first bytes that are not a whole frame."""
    position = 0
    while position < len(view):
        if len(view) - position < HEADER.size:
            yield None
            return
        length, checksum = HEADER.unpack_from(view, position)
        start = position + HEADER.size
        # No record is empty: zeros (a file a crash extended before its data reached the disk)
        # would otherwise read as frames, eight bytes each, every one a valid empty payload.
        if length == 0 or start + length > len(view):
            yield None
            return
        payload = bytes(view[start : start + length])
        if zlib.crc32(payload) != checksum:
            yield None
            return
        yield payload
        position = start + length
