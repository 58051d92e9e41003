"""The pool's frames (PoolFetch, PoolHit, PoolPut) and Request's hash ids: their limits and their hops."""

from __future__ import annotations

import pytest

from kvtransit.wire import Connection, ErrorCode, LocalProtocolError, RemoteProtocolError, Role, events
from kvtransit.wire._frames import FrameType, encode
from kvtransit.wire.limits import MAX_HASH_IDS


def _pair(sender: Role, receiver: Role):
    tx, rx = Connection(sender, receiver), Connection(receiver, sender)
    rx.receive_data(tx.send(events.Hello(sender, 1, "x")))
    assert isinstance(rx.next_event(), events.Hello)
    return tx, rx


def test_a_request_carries_its_block_ids_and_an_old_style_request_has_none():
    tx, rx = _pair(Role.LOADGEN, Role.PREFILL)
    ids = tuple(range(2**63 - 3, 2**63))
    rx.receive_data(tx.send(events.Request(1, 1600, 8, 5, hash_ids=ids)) + tx.send(events.Request(2, 10, 8, 6)))
    assert rx.next_event().hash_ids == ids
    assert rx.next_event().hash_ids == ()


def test_the_pool_conversation_crosses_the_middlebox_in_both_directions():
    tx, rx = _pair(Role.MIDDLEBOX, Role.KVPOOL)
    rx.receive_data(tx.send(events.PoolFetch(4, (7, 8))) + tx.send(events.PoolPut(5, (9,))))
    assert rx.next_event() == events.PoolFetch(4, (7, 8))
    assert rx.next_event() == events.PoolPut(5, (9,))
    back_tx, back_rx = _pair(Role.KVPOOL, Role.MIDDLEBOX)
    back_rx.receive_data(back_tx.send(events.PoolHit(4, 2, 512)))
    assert back_rx.next_event() == events.PoolHit(4, 2, 512)


@pytest.mark.parametrize("event,message", [
    (events.PoolFetch(1, ()), "is empty"),
    (events.PoolPut(1, tuple(range(MAX_HASH_IDS + 1))), "exceeds MAX_HASH_IDS"),
    (events.PoolFetch(1, (2**64,)), "out of range"),
    (events.PoolHit(1, 1, 0), "block_tokens 0 out of range"),
])
def test_a_pool_frame_out_of_its_limits_is_refused_when_sent(event, message):
    tx = Connection(Role.MIDDLEBOX, Role.KVPOOL) if not isinstance(event, events.PoolHit) else \
        Connection(Role.KVPOOL, Role.MIDDLEBOX)
    tx.send(events.Hello(tx.our_role, 1, "x"))
    with pytest.raises(LocalProtocolError, match=message):
        tx.send(event)


def test_a_pool_frame_whose_ids_are_not_whole_8_byte_words_is_the_peers_fault():
    head, _, _, _ = encode(events.PoolFetch(3, (1, 2)), LocalProtocolError, 1 << 20)
    # Rebuild the frame with 12 bytes of meta (one and a half ids): header CRC and meta CRC made valid.
    from kvtransit.wire import crc32c
    from kvtransit.wire._frames import _HEADER_BODY, HEADER_SIZE
    fields = list(_HEADER_BODY.unpack(head[:HEADER_SIZE - 4]))
    meta = head[HEADER_SIZE:HEADER_SIZE + 12]
    fields[-4], fields[-1] = 12, crc32c(meta)  # meta_length, meta_crc
    body = _HEADER_BODY.pack(*fields)
    frame = body + crc32c(body).to_bytes(4, "big") + meta
    _, rx = _pair(Role.MIDDLEBOX, Role.KVPOOL)
    rx.receive_data(frame)
    with pytest.raises(RemoteProtocolError, match="whole number of 8-byte ids") as info:
        rx.next_event()
    assert info.value.code == ErrorCode.MALFORMED_META


@pytest.mark.parametrize("sender,receiver", [(Role.LOADGEN, Role.PREFILL), (Role.MIDDLEBOX, Role.DECODE),
                                             (Role.DECODE, Role.MIDDLEBOX)])
def test_pool_frames_stay_off_the_hops_that_do_not_reach_the_pool(sender, receiver):
    tx = Connection(sender, receiver)
    tx.send(events.Hello(sender, 1, "x"))
    with pytest.raises(LocalProtocolError, match="may not send PoolFetch"):
        tx.send(events.PoolFetch(1, (1,)))


def test_pool_frame_types_are_numbered_after_the_original_ten():
    assert (FrameType.POOL_FETCH, FrameType.POOL_HIT, FrameType.POOL_PUT) == (11, 12, 13)
    assert Role.KVPOOL == 5
