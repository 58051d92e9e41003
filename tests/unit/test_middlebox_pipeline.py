"""One KV stream through the middlebox (agents/middlebox/pipeline.py), with the link and the stages as fakes:
order, how a stream ends, the byte budget, wire text clipped to the wire's byte limits, and a whole stream's hold
for tc's burst (by its wire bytes, with the real tbf mirror)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from kvtransit.agents.middlebox.pipeline import Abandoned, ByteBudget, Delivered, KvStream, Refused
from kvtransit.agents.middlebox.stages.kernel import KernelConfig, activate
from kvtransit.agents.middlebox.stages.link import TbfMirror
from kvtransit.kernels import KernelInputError
from kvtransit.model.module.budget import Module, Policy
from kvtransit.wire import ErrorCode
from kvtransit.wire.events import Error, KvChunk, KvEnd
from kvtransit.wire.limits import MAX_MESSAGE

from ._wire_samples import PAYLOAD, kv_stream

RID = 7
NONE_KERNEL = activate(KernelConfig(codec="none"), Module(ops_per_byte=1.6), Policy("host"))


class FakeLink:
    """What the stream sees of an egress transfer: every frame it sends, in order."""

    def __init__(self) -> None:
        self.sent: list = []
        self.ready_ns: list = []

    async def send(self, event, *, ready_ns=None, min_serialise_s=0.0) -> None:
        self.sent.append(event)
        self.ready_ns.append(ready_ns)


class PassThrough:
    """A stage chain that hands each chunk back as it came (or refuses the chunks it is told to)."""

    def __init__(self, refuse: set[int] = frozenset()):
        self.refuse = refuse

    async def run(self, item, kernel):
        if item.chunk.chunk in self.refuse:
            raise KernelInputError(f"chunk {item.chunk.chunk} has the wrong shape")
        return item


class Halving:
    """A stage chain whose kernel halves every chunk (as band-keep at keep 0.5 does)."""

    async def run(self, item, kernel):
        item.chunk = replace(item.chunk, payload=bytes(item.chunk.payload)[: len(item.chunk.payload) // 2])
        return item


class MirrorBurst:
    """The link stage's face to a stream under tc (pipeline.BurstHold), on the real tbf mirror."""

    def __init__(self, rate_Bps: float):
        self.tbf = TbfMirror(rate_Bps)

    def burst_hold_ns(self, ready_ns: int, nbytes: int) -> int:
        return self.tbf.hold_ns(ready_ns, nbytes)

    def burst_at_once_bytes(self, ready_ns: int) -> float:
        return self.tbf.at_once_bytes(ready_ns)

    def on_wire(self, at_ns: int, nbytes: int) -> None:
        self.tbf.sent(at_ns, nbytes)


def kv_end(rid: int) -> KvEnd:
    return KvEnd(rid, n_chunks=0, checksum=0, wire_bytes=0)


def chunks(n: int) -> list[KvChunk]:
    return kv_stream(RID, n)[1:]


async def ingest_all(stream: KvStream, events: list[KvChunk]) -> None:
    for event in events:
        await stream.ingest(event, source_codec="none")


async def test_a_stream_goes_onto_the_link_in_order_and_closes_with_its_kv_end():
    budget = ByteBudget(10 * len(PAYLOAD))
    stream, link, sent = KvStream(RID, PassThrough(), NONE_KERNEL, budget), FakeLink(), []
    await ingest_all(stream, chunks(3))
    stream.end()
    outcome = await stream.deliver(link, kv_end=kv_end, on_sent=sent.append)
    assert outcome == Delivered()
    assert [e.chunk for e in link.sent[:-1]] == [0, 1, 2] and link.sent[-1] == kv_end(RID)
    assert [item.chunk.chunk for item in sent] == [0, 1, 2]
    assert budget.used == 0 and stream.finished


async def test_an_aborted_stream_tells_the_next_hop_with_its_reason_clipped_to_the_byte_limit():
    stream, link = KvStream(RID, PassThrough(), NONE_KERNEL), FakeLink()
    await ingest_all(stream, chunks(1))
    stream.abort("prefill gave up: " + "接" * 400, ErrorCode.OVERLOADED)
    outcome = await stream.deliver(link, kv_end=kv_end, on_sent=lambda item: None)
    assert isinstance(outcome, Abandoned) and outcome.reason.endswith("接" * 400)  # the full reason, for logs
    error = link.sent[-1]
    assert isinstance(error, Error) and error.request_id == RID and error.code == ErrorCode.OVERLOADED
    assert len(error.message.encode()) <= MAX_MESSAGE and error.message.startswith("prefill gave up: 接")
    assert stream.finished


async def test_a_refused_chunk_ends_the_stream_with_an_error_and_discard_releases_the_rest():
    budget = ByteBudget(10 * len(PAYLOAD))
    stream, link = KvStream(RID, PassThrough(refuse={1}), NONE_KERNEL, budget), FakeLink()
    await ingest_all(stream, chunks(4))
    outcome = await stream.deliver(link, kv_end=kv_end, on_sent=lambda item: None)
    assert isinstance(outcome, Refused) and "kernel none refused request 7" in outcome.reason
    assert [type(e).__name__ for e in link.sent] == ["KvChunk", "Error"]
    assert not stream.finished and budget.used == 2 * len(PAYLOAD)  # chunks 2 and 3 still held
    discarding = asyncio.ensure_future(stream.discard())
    await asyncio.sleep(0)
    assert not discarding.done()  # the source has not ended the stream yet
    stream.end()
    await asyncio.wait_for(discarding, 1.0)
    assert budget.used == 0 and stream.finished


async def test_ingest_waits_while_the_connection_is_over_its_byte_budget():
    budget = ByteBudget(2 * len(PAYLOAD))
    stream, link = KvStream(RID, PassThrough(), NONE_KERNEL, budget), FakeLink()
    events = chunks(3)
    await ingest_all(stream, events[:2])
    third = asyncio.ensure_future(ingest_all(stream, events[2:]))
    await asyncio.sleep(0)
    assert not third.done() and budget.used == 2 * len(PAYLOAD)
    delivering = asyncio.ensure_future(stream.deliver(link, kv_end=kv_end, on_sent=lambda item: None))
    await asyncio.wait_for(third, 1.0)  # the link took a chunk: room for the third
    stream.end()
    assert await asyncio.wait_for(delivering, 1.0) == Delivered()
    assert budget.used == 0


async def test_a_chunk_larger_than_the_whole_budget_passes_alone():
    budget = ByteBudget(1)
    await budget.acquire(10)
    assert budget.used == 10
    budget.release(10)
    assert budget.used == 0


async def test_ingest_copies_the_payload_out_of_the_receive_buffer():
    buffer = bytearray(PAYLOAD)
    event = chunks(1)[0]
    view = memoryview(buffer)
    stream, link, sent = KvStream(RID, PassThrough(), NONE_KERNEL), FakeLink(), []
    await stream.ingest(KvChunk(**{**event.__dict__, "payload": view}), source_codec="none")
    buffer[:] = bytes(len(buffer))  # the connection reuses its buffer for the next read
    stream.end()
    await stream.deliver(link, kv_end=kv_end, on_sent=sent.append)
    assert bytes(sent[0].chunk.payload) == PAYLOAD


# A rate whose bucket (2 × 64 KiB of GSO, shaping/commands.py) is many of the test's 1 KiB chunks.
RATE_Bps = 16e6
START_NS = 10**12


async def test_a_compressed_whole_stream_under_tcs_bucket_is_held_by_its_wire_bytes_not_its_raw_ones():
    """The ib-ndr band-keep bug: 40 KiB raw, 20 KiB of wire, all under the bucket, tbf lets it all through at once;
    held by the raw bytes it ended (raw − wire) / rate late."""
    burst = MirrorBurst(RATE_Bps)
    stream, link = KvStream(RID, Halving(), NONE_KERNEL, ByteBudget(10**6)), FakeLink()
    await ingest_all(stream, chunks(40))
    stream.end()
    assert await stream.deliver(link, kv_end=kv_end, ready_ns=START_NS, on_sent=lambda item: None,
                                burst=burst) == Delivered()
    wire = 40 * len(PAYLOAD) // 2
    assert wire < burst.tbf.burst_bytes
    held_ns = link.ready_ns[0] - START_NS
    assert held_ns == pytest.approx(wire / RATE_Bps * 1e9, abs=1)
    assert set(link.ready_ns[:-1]) == {link.ready_ns[0]}  # every chunk paced from the one held start


async def test_a_whole_stream_larger_than_the_bucket_is_held_by_the_buckets_time_and_not_behind_a_queue():
    burst = MirrorBurst(RATE_Bps)
    n = 2 * int(burst.tbf.burst_bytes) // (len(PAYLOAD) // 2) + 8  # wire bytes past the bucket
    stream, link = KvStream(RID, Halving(), NONE_KERNEL, ByteBudget(10**7)), FakeLink()
    await ingest_all(stream, chunks(n))
    stream.end()
    await stream.deliver(link, kv_end=kv_end, ready_ns=START_NS, on_sent=lambda item: None, burst=burst)
    assert link.ready_ns[0] - START_NS == pytest.approx(burst.tbf.burst_bytes / RATE_Bps * 1e9, abs=1)
    # The next one, ready at once, finds tbf's queue full of those bytes: nothing passes at once, no hold.
    stream2, link2 = KvStream(RID + 1, Halving(), NONE_KERNEL, ByteBudget(10**7)), FakeLink()
    await ingest_all(stream2, chunks(4))
    stream2.end()
    await stream2.deliver(link2, kv_end=kv_end, ready_ns=START_NS, on_sent=lambda item: None, burst=burst)
    assert link2.ready_ns[0] == START_NS


async def test_the_burst_hold_never_waits_on_chunks_the_byte_budget_keeps_from_being_read():
    """A budget far below the bucket: the stream goes out as the reader is let go, held as for a full bucket."""
    burst = MirrorBurst(RATE_Bps)
    budget = ByteBudget(4 * len(PAYLOAD))
    stream, link = KvStream(RID, Halving(), NONE_KERNEL, budget), FakeLink()
    reading = asyncio.ensure_future(ingest_all(stream, chunks(40)))
    delivering = asyncio.ensure_future(stream.deliver(link, kv_end=kv_end, ready_ns=START_NS,
                                                      on_sent=lambda item: None, burst=burst))
    await asyncio.wait_for(reading, 1.0)
    stream.end()
    assert await asyncio.wait_for(delivering, 1.0) == Delivered()
    assert link.ready_ns[0] - START_NS == pytest.approx(burst.tbf.burst_bytes / RATE_Bps * 1e9, abs=1)
    assert budget.used == 0


async def test_a_chunk_refused_while_the_hold_is_worked_out_is_still_reported_in_order():
    burst = MirrorBurst(RATE_Bps)
    stream, link = KvStream(RID, PassThrough(refuse={2}), NONE_KERNEL, ByteBudget(10**6)), FakeLink()
    await ingest_all(stream, chunks(4))
    outcome = await stream.deliver(link, kv_end=kv_end, ready_ns=START_NS, on_sent=lambda item: None, burst=burst)
    assert isinstance(outcome, Refused)
    assert [type(e).__name__ for e in link.sent] == ["KvChunk", "KvChunk", "Error"]
