"""Garbage from the peer raises RemoteProtocolError naming the field and the value, with an error code."""

import struct

import pytest

from kvtransit.wire import (
    HEADER_SIZE,
    MAX_META,
    MAX_PAYLOAD,
    Connection,
    DType,
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
    Role,
    State,
    events,
)
from kvtransit.wire._crc import crc32c
from kvtransit.wire._frames import HEADER

from ._wire_samples import PAYLOAD, kv_stream


def _stream_to_first_chunk():
    tx = Connection(Role.PREFILL, Role.MIDDLEBOX)
    prefix = tx.send(events.Hello(Role.PREFILL, 1, "p")) + tx.send(kv_stream()[0])
    chunk = tx.send(kv_stream()[1])
    return prefix, bytearray(chunk)


def _refused(data: bytes, match: str, code: ErrorCode):
    rx = Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(bytes(data))
    def read_all() -> None:
        while rx.next_event() is not None:
            pass

    with pytest.raises(RemoteProtocolError, match=match) as info:
        read_all()
    assert info.value.code == code
    assert rx.their_state == State.ERROR


def _reseal(frame: bytearray) -> bytearray:
    """Recompute the header CRC so only the field we changed is wrong."""
    frame[HEADER_SIZE - 4:HEADER_SIZE] = crc32c(bytes(frame[:HEADER_SIZE - 4])).to_bytes(4, "big")
    return frame


def test_bad_magic_names_what_was_seen_and_expected():
    _refused(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 60, r"bad magic b'GET ' \(expected b'KVT1'\)",
             ErrorCode.BAD_MAGIC)


def test_bad_version_is_refused():
    _prefix, chunk = _stream_to_first_chunk()
    chunk[4] = 9
    _refused(_reseal(chunk), "unsupported wire version 9", ErrorCode.BAD_VERSION)


def test_payload_crc_mismatch_names_the_chunk():
    prefix, chunk = _stream_to_first_chunk()
    chunk[-1] ^= 0xFF
    _refused(prefix + chunk, "crc32c mismatch on KvChunk request 7 layer 0 chunk 0",
             ErrorCode.PAYLOAD_CRC_MISMATCH)


def test_header_crc_mismatch_is_refused():
    prefix, chunk = _stream_to_first_chunk()
    chunk[20] ^= 1  # the chunk index
    _refused(prefix + chunk, "header crc32c mismatch", ErrorCode.HEADER_CRC_MISMATCH)


def test_meta_crc_mismatch_is_refused():
    prefix, chunk = _stream_to_first_chunk()
    chunk[HEADER_SIZE] ^= 1  # first byte of the meta (raw_bytes)
    _refused(prefix + chunk, "meta crc32c mismatch", ErrorCode.META_CRC_MISMATCH)


@pytest.mark.parametrize("field,offset,fmt,value,match", [
    ("payload_length", 56, "!Q", 2**40, f"payload_length {2**40} exceeds MAX_PAYLOAD {MAX_PAYLOAD}"),
    ("meta_length", 52, "!I", MAX_META + 1, f"meta_length {MAX_META + 1} exceeds MAX_META"),
    ("codec_header_length", 48, "!H", 257, "codec_header_length 257 exceeds MAX_CODEC_HEADER 256"),
    ("ndim", 25, "!B", 6, r"ndim 6 out of range \[1, 5\]"),
    ("dtype", 24, "!B", 99, "unknown dtype 99"),
    ("frame_type", 5, "!B", 77, "unknown frame type 77"),
    ("flags", 6, "!H", 4, "unknown flags 0x0004"),
])
def test_oversized_or_unknown_header_fields_are_refused_before_the_body_arrives(field, offset, fmt, value, match):
    prefix, chunk = _stream_to_first_chunk()
    struct.pack_into(fmt, chunk, offset, value)
    code = ErrorCode.UNKNOWN_FRAME_TYPE if field == "frame_type" else ErrorCode.FIELD_OUT_OF_RANGE
    _refused(prefix + _reseal(chunk)[:HEADER_SIZE], match, code)  # header alone: no body needed


def test_raw_bytes_must_match_shape_and_dtype():
    events_ = kv_stream()
    tx = Connection(Role.PREFILL, Role.MIDDLEBOX)
    tx.send(events.Hello(Role.PREFILL, 1, "p"))
    tx.send(events_[0])
    with pytest.raises(LocalProtocolError, match=r"raw_bytes 10 != prod\(shape \(8, 64\)\) × BF16"):
        tx.send(events.KvChunk(7, 0, 0, DType.BF16, (8, 64), 0, b"", PAYLOAD, 10))


def test_eof_mid_frame_says_how_much_arrived():
    prefix, chunk = _stream_to_first_chunk()
    rx = Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(prefix + chunk[:-10])
    rx.next_event(), rx.next_event()
    rx.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match=f"peer closed mid-frame: got {len(chunk) - 10} of {len(chunk)}") \
            as info:
        rx.next_event()
    assert info.value.code == ErrorCode.TRUNCATED
    rx = Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(prefix[:30])
    rx.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match=f"got 30 of {HEADER_SIZE} header bytes"):
        rx.next_event()


@pytest.mark.parametrize("event,match", [
    (events.Hello(Role.PREFILL, 1, "x" * 65), "Hello.name is 65 UTF-8 bytes, exceeds its limit of 64"),
    (events.Bye("x" * 300), "Bye.reason is 300 UTF-8 bytes"),
])
def test_oversized_strings_are_our_misuse(event, match):
    with pytest.raises(LocalProtocolError, match=match):
        Connection(Role.PREFILL, Role.MIDDLEBOX).send(event)


def test_invalid_utf8_in_meta_is_refused():
    tx = Connection(Role.PREFILL, Role.MIDDLEBOX)
    frame = bytearray(tx.send(events.Hello(Role.PREFILL, 1, "ab")))
    frame[-1] = 0xFF
    body = bytes(frame[HEADER_SIZE:])
    struct.pack_into("!I", frame, 68, crc32c(body))
    _refused(_reseal(frame), "Hello.name is not valid UTF-8", ErrorCode.MALFORMED_META)


def test_header_layout_is_76_bytes_network_order():
    assert HEADER.size == HEADER_SIZE == 76 and HEADER.format.startswith("!")


def test_clipped_text_fits_its_byte_limit_and_never_splits_a_character():
    from kvtransit.wire.limits import MAX_MESSAGE, MAX_REASON, clip_message, clip_reason

    reason = "désolé, le lien est tombé — 接続が切れました " * 40  # well over both limits in bytes and in characters
    for clip, limit in ((clip_reason, MAX_REASON), (clip_message, MAX_MESSAGE)):
        clipped = clip(reason)
        assert len(clipped.encode("utf-8")) <= limit
        assert reason.startswith(clipped)  # a prefix: no character was split or replaced
        assert len(clipped.encode("utf-8")) > limit - 4  # and no more than one character short of the limit
    assert clip_reason("short") == "short"
