"""Every frame type survives a client → server round trip, whatever way the bytes are chunked."""

import random

import pytest

from kvtransit.wire import HEADER_SIZE, NEED_DATA, Connection, ConnectionClosed, DType, Role, State, events

from ._wire_samples import HOP_EVENTS, PAYLOAD, valid_stream


def drain(conn):
    out = []
    while (e := conn.next_event()) is not NEED_DATA:
        out.append(e)
        if isinstance(e, ConnectionClosed):
            break
    return out


def receive_in_pieces(sender, receiver, data, cuts):
    conn = Connection(receiver, sender)
    got, prev = [], 0
    for cut in [*cuts, len(data)]:
        conn.receive_data(data[prev:cut])
        prev = cut
        got += [_materialise(e) for e in drain(conn)]
    conn.receive_data(b"")
    got += drain(conn)
    return got


def _materialise(e):
    # payload views are only valid until the next receive_data: compare their bytes
    if isinstance(e, events.KvChunk):
        return events.KvChunk(**{**e.__dict__, "payload": bytes(e.payload)})
    return e


@pytest.mark.parametrize("hop", list(HOP_EVENTS), ids=lambda h: f"{h[0].name}->{h[1].name}")
def test_every_frame_type_round_trips_on_every_hop(hop):
    sent, data = valid_stream(*hop)
    assert receive_in_pieces(*hop, data, []) == [*sent, ConnectionClosed()]


def test_a_stream_split_at_every_byte_of_each_header_gives_identical_events():
    sent, data = valid_stream(Role.PREFILL, Role.MIDDLEBOX)
    expected = [*sent, ConnectionClosed()]
    # frame boundaries: re-parse lengths by sending each event alone
    conn, starts, offset = Connection(Role.PREFILL, Role.MIDDLEBOX), [], 0
    for e in sent:
        starts.append(offset)
        offset += len(conn.send(e))
    for start in starts:
        for k in range(1, HEADER_SIZE + 1):
            assert receive_in_pieces(Role.PREFILL, Role.MIDDLEBOX, data, [start + k]) == expected


def test_random_chunkings_give_identical_events():
    rng = random.Random(5)
    sent, data = valid_stream(Role.PREFILL, Role.MIDDLEBOX)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 40)))
        assert receive_in_pieces(Role.PREFILL, Role.MIDDLEBOX, data, cuts) == [*sent, ConnectionClosed()]


def test_get_buffer_receives_a_large_payload_in_place_as_a_view_of_the_receive_buffer():
    big = bytes(random.Random(1).randbytes(4 << 20))
    tx, rx = Connection(Role.PREFILL, Role.MIDDLEBOX), Connection(Role.MIDDLEBOX, Role.PREFILL)
    stream = tx.send(events.Hello(Role.PREFILL, 1, "p")) + tx.send(
        events.KvBegin(1, 8, 4, 1, 1, len(big), "none", 0))
    head, payload = tx.send_parts(events.KvChunk(1, 0, 0, DType.U8, (len(big),), 0, b"", big, len(big)))
    assert payload.obj is big  # send_parts did not copy the payload
    stream += head + bytes(payload)
    got, pos = [], 0
    while pos < len(stream):
        buf = rx.get_buffer(65536)
        n = min(len(buf), len(stream) - pos)
        buf[:n] = stream[pos:pos + n]
        del buf
        rx.buffer_updated(n)
        pos += n
        got += drain(rx)
    chunk = got[-1]
    assert isinstance(chunk, events.KvChunk) and chunk.payload == big
    assert chunk.payload.obj is rx._buf  # a view of the receive buffer, not a copy
    assert rx.buffer_capacity <= rx.max_buffer


def test_a_held_payload_view_is_never_overwritten_by_later_reads():
    tx, rx = Connection(Role.PREFILL, Role.MIDDLEBOX), Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(tx.send(events.Hello(Role.PREFILL, 1, "p")) + tx.send(
        events.KvBegin(1, 8, 4, 2, 2, 2 * len(PAYLOAD), "none", 0)))
    drain(rx)
    def chunk(i, fill):
        return events.KvChunk(1, i, i, DType.BF16, (8, 64), 0, b"", bytes([fill]) * 1024, 1024)
    rx.receive_data(tx.send(chunk(0, 0xAA)))
    (first,) = drain(rx)
    rx.receive_data(tx.send(chunk(1, 0x55)))
    (second,) = drain(rx)
    assert bytes(first.payload) == b"\xaa" * 1024 and bytes(second.payload) == b"\x55" * 1024


def _reference_crc32c(data: bytes) -> int:
    """Bit by bit, straight from the definition (reflected Castagnoli polynomial, RFC 3720 §B.4): an
    independent check on the C library the wire uses."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def test_the_reference_crc32c_gives_the_rfc_3720_check_value():
    assert _reference_crc32c(b"123456789") == 0xE3069283


def test_kv_end_checksum_is_crc32c_over_all_chunk_payloads_in_order():
    conn = Connection(Role.PREFILL, Role.MIDDLEBOX)
    conn.send(events.Hello(Role.PREFILL, 1, "p"))
    conn.send(events.KvBegin(1, 8, 4, 2, 2, 2048, "none", 0))
    parts = [b"a" * 1024, b"b" * 1024]
    for i, p in enumerate(parts):
        conn.send_parts(events.KvChunk(1, i, i, DType.BF16, (512,), 0, b"", p, 1024))
    end = conn.kv_end(1)
    assert end == events.KvEnd(1, 2, _reference_crc32c(b"".join(parts)), 2048)


def test_states_follow_hello_and_bye():
    _sent, data = valid_stream(Role.DECODE, Role.LOADGEN)
    rx = Connection(Role.LOADGEN, Role.DECODE)
    assert rx.their_state == State.AWAIT_HELLO
    rx.receive_data(data[:HEADER_SIZE + 20])
    rx.next_event()
    assert rx.their_state == State.OPEN
    rx.receive_data(data[HEADER_SIZE + 20:])
    drain(rx)
    assert rx.their_state == State.CLOSED
