"""The transition table, driven from the table itself: every frame a role may not send is refused on both
sides (LocalProtocolError for the sender, RemoteProtocolError for a receiver fed the raw frame)."""

import pytest

from kvtransit.wire import (
    ROLE_FRAMES,
    Connection,
    ErrorCode,
    FrameType,
    LocalProtocolError,
    RemoteProtocolError,
    Role,
    State,
    events,
)

from ._wire_samples import HOP_EVENTS, PAYLOAD, kv_stream

SAMPLE = {FrameType.HELLO: None,  # built per sender role
          FrameType.REQUEST: HOP_EVENTS[(Role.LOADGEN, Role.PREFILL)][0],
          FrameType.FIRST_TOKEN: events.FirstToken(1, 5),
          FrameType.KV_BEGIN: kv_stream()[0],
          FrameType.KV_CHUNK: kv_stream()[1],
          FrameType.KV_END: events.KvEnd(7, 1, 0, 0),
          FrameType.TOKENS: HOP_EVENTS[(Role.DECODE, Role.LOADGEN)][0],
          FrameType.ACK: events.Ack(7, events.AckStatus.OK),
          FrameType.ERROR: events.Error(ErrorCode.INTERNAL, "x"),
          FrameType.BYE: events.Bye(),
          FrameType.POOL_FETCH: events.PoolFetch(7, (11, 12)),
          FrameType.POOL_HIT: events.PoolHit(7, 1, 512),
          FrameType.POOL_PUT: events.PoolPut(7, (11,))}


def _raw_frame(frame_type, sender):
    """Encode a frame bypassing the sender's checks (a misbehaving peer)."""
    from kvtransit.wire._frames import encode
    e = events.Hello(sender, 1, "x") if frame_type == FrameType.HELLO else SAMPLE[frame_type]
    head, payload, _, _ = encode(e, LocalProtocolError, 1 << 20)
    return head + (bytes(payload) if payload is not None else b"")


FORBIDDEN = [(s, r, t) for (s, r), allowed in ROLE_FRAMES.items() for t in FrameType if t not in allowed]


@pytest.mark.parametrize("sender,receiver,frame_type", FORBIDDEN, ids=lambda v: getattr(v, "name", str(v)))
def test_a_frame_the_table_forbids_is_refused_by_sender_and_receiver(sender, receiver, frame_type):
    tx = Connection(sender, receiver)
    tx.send(events.Hello(sender, 1, "x"))
    with pytest.raises(LocalProtocolError, match="may not send"):
        tx.send(SAMPLE[frame_type] or events.Hello(sender, 1, "x"))
    assert tx.our_state == State.ERROR
    rx = Connection(receiver, sender)
    rx.receive_data(_raw_frame(FrameType.HELLO, sender) + _raw_frame(frame_type, sender))
    rx.next_event()
    with pytest.raises(RemoteProtocolError, match="may not send") as info:
        rx.next_event()
    assert info.value.code == ErrorCode.ILLEGAL_FRAME and rx.their_state == State.ERROR


@pytest.mark.parametrize("frame_type", [t for t in FrameType if t not in (FrameType.HELLO, FrameType.ERROR,
                                                                           FrameType.BYE)])
def test_nothing_but_hello_error_or_bye_may_come_before_hello(frame_type):
    sender, receiver = next((s, r) for (s, r), a in ROLE_FRAMES.items() if frame_type in a)
    with pytest.raises(LocalProtocolError, match="before Hello"):
        Connection(sender, receiver).send(SAMPLE[frame_type])
    rx = Connection(receiver, sender)
    rx.receive_data(_raw_frame(frame_type, sender))
    with pytest.raises(RemoteProtocolError, match="before Hello"):
        rx.next_event()


def test_nothing_may_follow_bye_and_a_failed_connection_refuses_further_use():
    tx = Connection(Role.PREFILL, Role.MIDDLEBOX)
    tx.send(events.Hello(Role.PREFILL, 1, "p"))
    tx.send(events.Bye())
    with pytest.raises(LocalProtocolError, match="after Bye"):
        tx.send(events.Bye())
    rx = Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(_raw_frame(FrameType.HELLO, Role.PREFILL) + _raw_frame(FrameType.BYE, Role.PREFILL) * 2)
    rx.next_event(), rx.next_event()
    with pytest.raises(RemoteProtocolError, match="after Bye"):
        rx.next_event()
    with pytest.raises(RemoteProtocolError, match="already failed"):
        rx.next_event()
    # after the peer's error we may still tell it why, and nothing else
    rx.send(events.Error(ErrorCode.ILLEGAL_FRAME, "Bye after Bye"))
    with pytest.raises(LocalProtocolError, match="only Error and Bye"):
        rx.send(events.Ack(1, events.AckStatus.OK))


def test_hello_must_name_the_expected_role_and_version():
    with pytest.raises(LocalProtocolError, match="Hello from role decode, expected prefill"):
        Connection(Role.PREFILL, Role.MIDDLEBOX).send(events.Hello(Role.DECODE, 1, "d"))
    rx = Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(_raw_frame(FrameType.HELLO, Role.DECODE))
    with pytest.raises(RemoteProtocolError, match="expected prefill"):
        rx.next_event()


def _kv_pair():
    tx, rx = Connection(Role.PREFILL, Role.MIDDLEBOX), Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(tx.send(events.Hello(Role.PREFILL, 1, "p")))
    rx.next_event()
    return tx, rx


def _chunk(request_id=7, chunk=0, layer=0):
    return events.KvChunk(request_id, layer, chunk, events.DType.BF16, (8, 64), 0, b"", PAYLOAD, len(PAYLOAD))


@pytest.mark.parametrize("sequence,message", [
    ([_chunk()], "no open KV stream"),
    ([events.KvEnd(7, 1, 0, 0)], "no open KV stream"),
    ([kv_stream()[0], kv_stream()[0]], "already open"),
    ([kv_stream()[0], _chunk(chunk=1)], "out of order"),
    ([kv_stream()[0], _chunk(layer=2)], "beyond n_layers"),
    ([kv_stream()[0], _chunk(), events.KvEnd(7, 1, 0, 1024)], "1 of 2 chunks"),
], ids=["chunk-unknown", "end-unknown", "double-begin", "chunk-skip", "layer-range", "end-early"])
def test_kv_per_request_order_is_enforced_on_both_sides(sequence, message):
    tx, rx = _kv_pair()
    for e in sequence[:-1]:
        rx.receive_data(b"".join(tx.send_parts(e)))
        rx.next_event()
    with pytest.raises(LocalProtocolError, match=message):
        tx.send_parts(sequence[-1])
    from kvtransit.wire._frames import encode
    head, payload, _, _ = encode(sequence[-1], LocalProtocolError, 1 << 20)
    rx.receive_data(head + (bytes(payload) if payload is not None else b""))
    with pytest.raises(RemoteProtocolError, match=message) as info:
        rx.next_event()
    assert info.value.code == ErrorCode.KV_SEQUENCE


def test_a_kv_end_whose_checksum_disagrees_with_the_chunks_is_refused():
    tx, rx = _kv_pair()
    begin = events.KvBegin(7, 8, 4, 1, 1, 1024, "none", 0)
    for e in (begin, _chunk()):
        rx.receive_data(b"".join(tx.send_parts(e)))
        rx.next_event()
    good = tx.kv_end(7)
    bad = events.KvEnd(7, 1, good.checksum ^ 1, good.wire_bytes)
    with pytest.raises(LocalProtocolError, match="checksum"):
        tx.send(bad)
    from kvtransit.wire._frames import encode
    rx.receive_data(encode(bad, LocalProtocolError, 1 << 20)[0])
    with pytest.raises(RemoteProtocolError, match="checksum") as info:
        rx.next_event()
    assert info.value.code == ErrorCode.KV_CHECKSUM_MISMATCH


def test_a_hop_that_does_not_exist_cannot_be_built():
    with pytest.raises(ValueError, match="no connection exists between loadgen and middlebox"):
        Connection(Role.LOADGEN, Role.MIDDLEBOX)


def test_error_naming_a_request_aborts_its_open_kv_stream_on_both_sides():
    """A middlebox whose source died mid-request tells decode with Error(request_id); the stream is gone on
    both sides (a later KvChunk for it is illegal) and other streams carry on."""
    from kvtransit.wire import Connection, Role
    from kvtransit.wire import events as ev
    from kvtransit.wire.errors import ErrorCode, RemoteProtocolError

    mb = Connection(our_role=Role.MIDDLEBOX, their_role=Role.DECODE)
    dec = Connection(our_role=Role.DECODE, their_role=Role.MIDDLEBOX)
    wire = mb.send(ev.Hello(role=Role.MIDDLEBOX, version=1, name="mb"))
    for rid in (1, 2):
        wire += mb.send(ev.KvBegin(request_id=rid, prompt_tokens=4, output_tokens=2, n_layers=1, n_chunks=1,
                                   raw_bytes=8, codec="none", first_token_ns=0))
    wire += mb.send(ev.Error(code=ErrorCode.INTERNAL, message="prefill lost", request_id=1))
    chunk = ev.KvChunk(request_id=2, layer=0, chunk=0, dtype=ev.DType.BF16, shape=(4,), codec_id=0,
                       codec_header=b"", payload=b"\x00" * 8, raw_bytes=8)
    wire += mb.send(chunk) + mb.send(mb.kv_end(2))
    dec.receive_data(wire)
    kinds = []
    while True:
        e = dec.next_event()
        if e is ev.NEED_DATA:
            break
        kinds.append(type(e).__name__)
    assert kinds == ["Hello", "KvBegin", "KvBegin", "Error", "KvChunk", "KvEnd"]
    # Request 1 is closed on the receiver too: a chunk for it is now a protocol error.
    stray = Connection(our_role=Role.MIDDLEBOX, their_role=Role.DECODE)
    stray.send(ev.Hello(role=Role.MIDDLEBOX, version=1, name="x"))
    stray.send(ev.KvBegin(request_id=1, prompt_tokens=4, output_tokens=2, n_layers=1, n_chunks=1, raw_bytes=8,
                          codec="none", first_token_ns=0))
    late = stray.send(ev.KvChunk(request_id=1, layer=0, chunk=0, dtype=ev.DType.BF16, shape=(4,), codec_id=0,
                                 codec_header=b"", payload=b"\x00" * 8, raw_bytes=8))
    dec.receive_data(late)
    with pytest.raises(RemoteProtocolError, match="no open KV stream"):
        dec.next_event()
