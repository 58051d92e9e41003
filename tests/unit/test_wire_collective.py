"""The collective frames (wire/group.py): a round trip field by field, split anywhere, and bad bytes named."""

from __future__ import annotations

import struct

import pytest

from kvtransit.wire.group import (
    HEADER_SIZE,
    MAX_REASON,
    CollectiveFrameError,
    Frame,
    FrameReader,
    Kind,
    abort,
    encode,
    encode_bytes,
)

FRAME = Frame(Kind.PART, group=7, step=3, layer=159, rank=5, chunk=2, due_ns=123_456_789_012, payload=b"\x01\x02" * 50)


def test_header_is_44_bytes_and_a_frame_round_trips():
    header, payload = encode(FRAME)
    assert len(header) == HEADER_SIZE == 44
    assert bytes(payload) == FRAME.payload
    assert FrameReader().feed(header + bytes(payload)) == [FRAME]


def test_frames_split_at_every_byte_come_out_whole_and_in_order():
    second = Frame(Kind.SUM, group=7, step=3, layer=159, rank=0, payload=b"xyz")
    data = encode_bytes(FRAME) + encode_bytes(second)
    reader = FrameReader()
    out = []
    for i in range(len(data)):
        out += reader.feed(data[i:i + 1])
    assert out == [FRAME, second]
    assert reader.buffered == 0


def test_an_abort_carries_its_reason_clipped_on_a_character_boundary():
    frame = FrameReader().feed(encode_bytes(abort(1, "rank 2 died at step 4, layer 9")))[0]
    assert (frame.kind, frame.reason) == (Kind.ABORT, "rank 2 died at step 4, layer 9")
    long = abort(1, "é" * MAX_REASON)
    assert len(long.payload) <= MAX_REASON
    assert long.reason == "é" * (MAX_REASON // 2)


def test_a_flipped_payload_byte_is_a_crc_mismatch_naming_the_frame():
    data = bytearray(encode_bytes(FRAME))
    data[-1] ^= 0xFF
    with pytest.raises(CollectiveFrameError, match=r"payload CRC32C mismatch.*step 3, layer 159, rank 5"):
        FrameReader().feed(data)


def test_bad_magic_and_header_crc_are_refused_and_the_reader_stays_spent():
    data = bytearray(encode_bytes(FRAME))
    data[0:4] = b"KVTX"
    reader = FrameReader()
    with pytest.raises(CollectiveFrameError, match="bad magic"):
        reader.feed(data)
    with pytest.raises(CollectiveFrameError, match="bad magic"):
        reader.feed(encode_bytes(FRAME))
    flipped = bytearray(encode_bytes(FRAME))
    flipped[10] ^= 1
    with pytest.raises(CollectiveFrameError, match="header CRC32C mismatch"):
        FrameReader().feed(flipped)


def test_an_unknown_kind_with_a_valid_header_crc_is_named():
    from kvtransit.wire._crc import crc32c

    body = bytearray(encode_bytes(FRAME)[:HEADER_SIZE - 4])
    body[5] = 99
    with pytest.raises(CollectiveFrameError, match="unknown kind 99"):
        FrameReader().feed(bytes(body) + struct.pack("!I", crc32c(bytes(body))) + FRAME.payload)


@pytest.mark.parametrize("field, value", [("rank", 70_000), ("step", -1), ("due_ns", 2**64)])
def test_fields_out_of_range_are_refused_when_encoding(field, value):
    from dataclasses import replace

    with pytest.raises(CollectiveFrameError, match=f"{field} must be an integer"):
        encode(replace(FRAME, **{field: value}))
