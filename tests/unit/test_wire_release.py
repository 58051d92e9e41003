"""KvChunk's release time (layer-wise streaming): carried as an optional meta tail, so a chunk without one
is the very frame it was before the field existed, and one with it round-trips on every KV hop."""

from __future__ import annotations

import dataclasses

import pytest

from kvtransit.wire import HEADER_SIZE, NEED_DATA, Connection, ErrorCode, RemoteProtocolError, Role, State, events
from kvtransit.wire._crc import crc32c

from ._wire_samples import kv_stream

RELEASE_NS = 10**15 + 123_456


def _frames(chunk: events.KvChunk) -> tuple[bytes, bytes]:
    """(Hello + KvBegin, the chunk's frame) as a prefill sends them."""
    tx = Connection(Role.PREFILL, Role.MIDDLEBOX)
    prefix = tx.send(events.Hello(Role.PREFILL, 1, "p")) + tx.send(kv_stream()[0])
    return prefix, tx.send(chunk)


def _read_all(data: bytes) -> list:
    rx = Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(data)
    out = []
    while (event := rx.next_event()) is not NEED_DATA:
        out.append(event)
    return out


def _meta_length(frame: bytes) -> int:
    return int.from_bytes(frame[52:56], "big")


def test_a_chunk_with_a_release_time_arrives_with_it():
    chunk = dataclasses.replace(kv_stream()[1], release_ns=RELEASE_NS)
    prefix, frame = _frames(chunk)
    received = _read_all(prefix + frame)[-1]
    assert isinstance(received, events.KvChunk) and received.release_ns == RELEASE_NS
    assert bytes(received.payload) == bytes(chunk.payload)


def test_a_chunk_without_a_release_time_is_the_frame_it_always_was():
    plain = kv_stream()[1]
    _, frame = _frames(plain)
    _, stamped = _frames(dataclasses.replace(plain, release_ns=RELEASE_NS))
    assert _meta_length(frame) == 8 and _meta_length(stamped) == 16  # raw_bytes, then the tail only when set
    assert _read_all(_frames(plain)[0] + frame)[-1].release_ns == 0


def _with_meta(frame: bytes, meta: bytes) -> bytes:
    """`frame` (no codec header) with its meta replaced and every length and CRC made right again."""
    header = bytearray(frame[:HEADER_SIZE])
    old_meta = _meta_length(frame)
    payload = frame[HEADER_SIZE + old_meta:]
    header[52:56] = len(meta).to_bytes(4, "big")
    header[68:72] = crc32c(meta).to_bytes(4, "big")
    header[72:76] = crc32c(bytes(header[:72])).to_bytes(4, "big")
    return bytes(header) + meta + payload


@pytest.mark.parametrize("tail,match", [
    ((0).to_bytes(8, "big"), "release_ns of 0 is sent as no release_ns"),
    (b"\x01\x02\x03", "meta_length 11 on KvChunk request 7 layer 0 chunk 0, expected 8 or 16"),
])
def test_a_malformed_release_tail_is_refused_naming_the_chunk(tail, match):
    plain = kv_stream()[1]
    prefix, frame = _frames(plain)
    bad = _with_meta(frame, len(plain.payload).to_bytes(8, "big") + tail)
    rx = Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(prefix + bad)
    assert isinstance(rx.next_event(), events.Hello) and isinstance(rx.next_event(), events.KvBegin)
    with pytest.raises(RemoteProtocolError, match=match) as info:
        rx.next_event()
    assert info.value.code == ErrorCode.MALFORMED_META and rx.their_state == State.ERROR


def test_release_times_do_not_enter_the_streams_checksum():
    """The KvEnd's CRC covers payloads only: a stream relayed with or without release times closes the same."""
    ends = []
    for release in (0, RELEASE_NS):
        tx = Connection(Role.MIDDLEBOX, Role.DECODE)
        tx.send(events.Hello(Role.MIDDLEBOX, 1, "m"))
        begin, *chunks = kv_stream(n_chunks=3)
        tx.send(begin)
        for chunk in chunks:
            tx.send(dataclasses.replace(chunk, release_ns=release))
        ends.append(tx.kv_end(begin.request_id))
    assert ends[0] == ends[1]
