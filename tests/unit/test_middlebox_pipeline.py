"""One KV stream through the middlebox (agents/middlebox/pipeline.py), with the link and the stages as fakes:
order, how a stream ends, the byte budget, and wire text clipped to the wire's byte limits."""

from __future__ import annotations

import asyncio

from kvtransit.agents.middlebox.pipeline import Abandoned, ByteBudget, Delivered, KvStream, Refused
from kvtransit.agents.middlebox.stages.kernel import KernelConfig, activate
from kvtransit.kernels import KernelInputError
from kvtransit.model.module import Module, Policy
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

    async def send(self, event, *, ready_ns=None, min_serialise_s=0.0) -> None:
        self.sent.append(event)


class PassThrough:
    """A stage chain that hands each chunk back as it came (or refuses the chunks it is told to)."""

    def __init__(self, refuse: set[int] = frozenset()):
        self.refuse = refuse

    async def run(self, item, kernel):
        if item.chunk.chunk in self.refuse:
            raise KernelInputError(f"chunk {item.chunk.chunk} has the wrong shape")
        return item


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
