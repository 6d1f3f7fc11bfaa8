"""Frames: whole ones come back byte for byte; whatever a killed append leaves is refused whole;
damage in the middle is stepped over, and what it held is counted by sequence numbers."""

from __future__ import annotations

import struct
import zlib

from art_proxy.journal.frames import (
    HEADER,
    MAX_PAYLOAD,
    buffer_reader,
    frame_bytes,
    scan,
    survey,
)

PAYLOADS = [b'{"a":1}', b"y", b"x" * 70_000]


def journal_bytes(payloads: list[bytes] = PAYLOADS, first_seq: int = 0) -> bytes:
    return b"".join(frame_bytes(payload, first_seq + n) for n, payload in enumerate(payloads))


def legacy_frame(payload: bytes) -> bytes:
    """A frame as journals wrote them before frames carried a magic and a sequence number."""
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def surveyed(data: bytes, previous_seq: int | None = None):  # type: ignore[no-untyped-def]
    return survey(buffer_reader(data), len(data), previous_seq)


def test_whole_frames_come_back_in_order_with_their_offsets_and_sequence_numbers() -> None:
    found = scan(journal_bytes(first_seq=5))
    assert [frame.payload for frame in found.frames] == PAYLOADS
    assert [frame.seq for frame in found.frames] == [5, 6, 7]
    assert not found.torn and found.end == len(journal_bytes())
    assert found.frames[1].start == HEADER.size + len(PAYLOADS[0])


def test_a_cut_header_a_cut_payload_and_a_bad_checksum_are_each_torn() -> None:
    whole = journal_bytes()
    last = frame_bytes(b"tail", 3)
    for tail in (last[:5], last[:-1], last[:-4] + b"tall"):
        found = scan(whole + tail)
        assert found.torn
        assert [frame.payload for frame in found.frames] == PAYLOADS
        assert found.end == len(whole)


def test_the_checksum_covers_the_length_and_the_sequence_number() -> None:
    frame = bytearray(frame_bytes(b"payload", 9))
    frame[12] ^= 0x01  # the sequence number's lowest byte: 9 -> 8
    assert scan(bytes(frame)).frames == []


def test_a_length_past_the_end_or_past_the_bound_is_torn_not_read() -> None:
    found = scan(struct.pack("<II", 2**31, 0) + b"abc")
    assert found.torn and found.frames == [] and found.end == 0
    oversized = b"APJ2" + struct.pack("<IQI", MAX_PAYLOAD + 1, 0, 0)
    assert scan(oversized + bytes(64)).frames == []


def test_max_frames_stops_early_without_calling_the_rest_torn() -> None:
    found = scan(journal_bytes(), 100, max_frames=2)
    assert [frame.payload for frame in found.frames] == PAYLOADS[:2]
    assert not found.torn
    assert found.end == 100 + 2 * HEADER.size + len(PAYLOADS[0]) + len(PAYLOADS[1])


def test_zeros_after_the_frames_are_torn_not_empty_frames() -> None:
    """A machine that crashed may leave a file extended with zeros its data never reached."""
    found = scan(journal_bytes() + bytes(4096))
    assert [frame.payload for frame in found.frames] == PAYLOADS
    assert found.torn and found.end == len(journal_bytes())
    assert surveyed(journal_bytes() + bytes(4096)).torn == 4096


def test_a_flipped_byte_in_the_middle_loses_only_its_frame() -> None:
    """The old format stopped at the first bad frame: up to a whole segment of answered calls."""
    payloads = [f"record {n}".encode() * 50 for n in range(10)]
    data = bytearray(journal_bytes(payloads))
    fourth = len(journal_bytes(payloads[:3]))
    data[fourth + HEADER.size + 7] ^= 0x40  # a bit of the fourth record's payload
    found = surveyed(bytes(data))
    assert found.frames == 9 and found.torn == 0 and found.last_seq == 9
    [damage] = found.damage
    assert (damage.start, damage.end) == (fourth, len(journal_bytes(payloads[:4])))
    assert damage.lost == 1


def test_damage_spanning_several_frames_counts_each_by_its_sequence_number() -> None:
    payloads = [f"record {n}".encode() * 500 for n in range(8)]
    data = bytearray(journal_bytes(payloads))
    start, end = len(journal_bytes(payloads[:2])), len(journal_bytes(payloads[:5]))
    data[start + 3 : end - 10] = bytes(end - 13 - start)  # a lost stretch of pages, zeroed
    found = surveyed(bytes(data))
    assert found.frames == 5
    [damage] = found.damage
    assert (damage.start, damage.end, damage.lost) == (start, end, 3)


def test_damage_at_a_files_start_is_counted_from_the_slots_previous_file() -> None:
    payloads = [b"a" * 100, b"b" * 100, b"c" * 100]
    data = bytearray(journal_bytes(payloads, first_seq=40))
    data[2] ^= 0xFF  # the first frame's magic
    found = surveyed(bytes(data), previous_seq=39)
    [damage] = found.damage
    assert (damage.start, damage.lost) == (0, 1)
    assert found.frames == 2


def test_a_legacy_file_is_read_and_its_damage_ends_it() -> None:
    legacy = b"".join(legacy_frame(payload) for payload in PAYLOADS)
    found = scan(legacy)
    assert [frame.payload for frame in found.frames] == PAYLOADS
    assert [frame.seq for frame in found.frames] == [None, None, None]
    damaged = bytearray(legacy)
    damaged[-5] ^= 0x01
    assert surveyed(bytes(damaged)).frames == 2
    assert surveyed(bytes(damaged)).torn == len(legacy_frame(PAYLOADS[2]))


def test_a_survey_reads_a_large_file_a_window_at_a_time() -> None:
    payloads = [bytes([n % 251]) * 300_000 for n in range(12)]  # 3.6 MB
    data = journal_bytes(payloads)
    reads: list[int] = []
    read = buffer_reader(data)

    def counted(offset: int, length: int):  # type: ignore[no-untyped-def]
        reads.append(length)
        return read(offset, length)

    found = survey(counted, len(data))
    assert found.frames == 12 and found.end == len(data)
    assert max(reads) <= 2**20
