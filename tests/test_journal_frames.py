"""Frames: whole ones come back byte for byte; whatever a killed append leaves is refused whole."""

from __future__ import annotations

import struct

from art_proxy.journal.frames import HEADER, header, scan

PAYLOADS = [b'{"a":1}', b"y", b"x" * 70_000]


def journal_bytes() -> bytes:
    return b"".join(header(payload) + payload for payload in PAYLOADS)


def test_whole_frames_come_back_in_order_with_their_offsets() -> None:
    found = scan(journal_bytes())
    assert [frame.payload for frame in found.frames] == PAYLOADS
    assert not found.torn and found.end == len(journal_bytes())
    assert found.frames[1].start == HEADER.size + len(PAYLOADS[0])


def test_a_cut_header_a_cut_payload_and_a_bad_checksum_are_each_torn() -> None:
    whole = journal_bytes()
    last = header(b"tail") + b"tail"
    for tail in (last[:5], last[:-1], header(b"tail") + b"tall"):
        found = scan(whole + tail)
        assert found.torn
        assert [frame.payload for frame in found.frames] == PAYLOADS
        assert found.end == len(whole)


def test_a_length_past_the_end_is_torn_not_read() -> None:
    found = scan(struct.pack("<II", 2**31, 0) + b"abc")
    assert found.torn and found.frames == [] and found.end == 0


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
