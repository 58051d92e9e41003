"""The write-back stream's one reader (flows/tier/pool_stream.py), as the middlebox's pool path and the pool
use it: PoolPut names the blocks, KvBegin opens the put, chunks, KvEnd closes it, an Error aborts it (or, before
its KvBegin, withdraws it). No sockets."""

from __future__ import annotations

from kvtransit.flows.tier.pool_stream import PutAborted, PutAssembler, PutChunk, PutEnded, PutOpened, PutWithdrawn
from kvtransit.wire import ErrorCode
from kvtransit.wire.events import Bye, Error, KvEnd, PoolFetch, PoolPut
from kvtransit.wire.limits import MAX_OPEN_KV_STREAMS
from tests.unit._wire_samples import kv_stream


def end(rid: int) -> KvEnd:
    return KvEnd(rid, n_chunks=2, checksum=0, wire_bytes=0)


def test_a_put_opens_with_its_blocks_yields_its_chunks_in_order_and_ends():
    puts = PutAssembler()
    begin, *chunks = kv_stream(7, 2)
    assert puts.receive(PoolPut(7, (11, 12))) is None
    opened = puts.receive(begin)
    assert isinstance(opened, PutOpened) and opened.put.hash_ids == (11, 12) and opened.put.begin == begin
    steps = [puts.receive(chunk) for chunk in chunks]
    assert all(isinstance(s, PutChunk) and s.put is opened.put for s in steps)
    assert [s.chunk.chunk for s in steps] == [0, 1]
    assert puts.receive(end(7)) == PutEnded(opened.put)
    assert puts.close() == []


def test_a_kv_begin_without_a_pool_put_opens_a_put_naming_no_blocks():
    puts = PutAssembler()
    opened = puts.receive(kv_stream(3, 1)[0])
    assert isinstance(opened, PutOpened) and opened.put.hash_ids == ()


def test_an_error_naming_an_open_put_aborts_it_and_nothing_more_arrives_for_it():
    puts = PutAssembler()
    begin, chunk = kv_stream(5, 1)
    puts.receive(PoolPut(5, (1,)))
    opened = puts.receive(begin)
    error = Error(ErrorCode.REQUEST_FAILED, "prefill gave up", request_id=5)
    assert puts.receive(error) == PutAborted(opened.put, error)
    assert puts.receive(chunk) is None and puts.receive(end(5)) is None


def test_an_error_naming_a_put_announced_but_not_begun_withdraws_it():
    puts = PutAssembler()
    puts.receive(PoolPut(4, (21, 22)))
    error = Error(ErrorCode.REQUEST_FAILED, "prefill gave up", request_id=4)
    assert puts.receive(error) == PutWithdrawn(4, (21, 22), error)
    assert puts.receive(error) is None  # withdrawn once: the announcement is gone
    assert puts.receive(kv_stream(4, 1)[0]).put.hash_ids == ()  # a later KvBegin names no blocks


def test_events_that_are_not_part_of_a_put_are_left_to_the_caller():
    puts = PutAssembler()
    assert puts.receive(PoolFetch(1, (1, 2))) is None
    assert puts.receive(Bye("done")) is None
    assert puts.receive(Error(ErrorCode.REQUEST_FAILED, "not ours", request_id=99)) is None


def test_closing_hands_back_the_puts_still_open():
    puts = PutAssembler()
    first = puts.receive(kv_stream(1, 2)[0]).put
    second = puts.receive(kv_stream(2, 2)[0]).put
    puts.receive(end(1))
    assert puts.close() == [second] and first is not second


def test_announcements_that_never_begin_are_bounded():
    puts = PutAssembler()
    for rid in range(MAX_OPEN_KV_STREAMS + 10):
        puts.receive(PoolPut(rid, (rid,)))
    assert puts.receive(kv_stream(0, 1)[0]).put.hash_ids == ()  # the oldest announcement was forgotten
    assert puts.receive(kv_stream(MAX_OPEN_KV_STREAMS + 9, 1)[0]).put.hash_ids == (MAX_OPEN_KV_STREAMS + 9,)
