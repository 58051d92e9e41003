"""The prefill withdraws a request whose client went away (the client's Error naming it): queued, it is never
computed; held for its hand-off, its KV is released, and a stream going out stops and is aborted with an Error
naming it, so the middlebox drops what it had. ManualClock and in-memory endpoints: no sockets, no sleeping."""

from __future__ import annotations

import asyncio

from kvtransit.agents.prefill.agent import PrefillAgent
from kvtransit.agents.prefill.handoffs import HeldHandoff, ReleaseSchedule
from kvtransit.agents.process import Address
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE, StepWindow
from kvtransit.model.serving.prefill_plan import BatchEntry, plan_prefill_step
from kvtransit.runtime.clock import ManualClock
from kvtransit.wire import DType, ErrorCode
from kvtransit.wire.events import Error, FirstToken, KvBegin, KvChunk, KvEnd, Request, Role

from ._manual_time import cancel, collect, greeted_pair, prefill_link_to_memory_middlebox
from ._wire_samples import PAYLOAD

SCENARIO = Scenario(codec="none", dilation=2.0)
ANY = Address("127.0.0.1", 0)
T0 = 10**12
GONE = Error(code=ErrorCode.REQUEST_FAILED, message="client gone", request_id=2)


def step_ns(*requests: tuple[int, int, int]) -> int:
    return round(plan_prefill_step(SCENARIO, [BatchEntry(rid, p, o) for rid, p, o in requests]).wall_s * 1e9)


async def start(clock):
    agent = PrefillAgent(SCENARIO, name="prefill-test", listen=ANY, kv_to=ANY, metrics_listen=ANY, clock=clock)
    client, serving = await greeted_pair(Role.LOADGEN, Role.PREFILL, agent.serve_client)
    received: list = []
    tasks = [serving, collect(client, clock, received), asyncio.create_task(agent.step_loop())]
    return agent, client, received, tasks


async def test_a_request_withdrawn_while_queued_is_never_computed_and_the_next_takes_its_place():
    clock = ManualClock(T0)
    agent, client, received, tasks = await start(clock)
    try:
        await client.send(Request(request_id=1, prompt_tokens=2000, output_tokens=8, sent_ns=T0))
        await clock.advance_ns(0)  # request 1's step is running
        await client.send(Request(request_id=2, prompt_tokens=6000, output_tokens=8, sent_ns=T0))
        await client.send(Request(request_id=3, prompt_tokens=500, output_tokens=8, sent_ns=T0))
        await client.send(GONE)
        await clock.advance_ns(0)
        assert agent.queue.queued_tokens == 500
        first = T0 + step_ns((1, 2000, 8))
        # Request 3's step follows at once (+1 µs for rounding): request 2's 6,000 tokens are not held for.
        await clock.advance_ns(first + step_ns((3, 500, 8)) + 1_000 - T0)
        assert [e.request_id for e, _ in received if isinstance(e, FirstToken)] == [1, 3]
        assert set(agent.handoffs.held) == {1, 3}
        assert agent.stats()["cancelled"] == {"queued": 1, "handoff": 0}
    finally:
        await cancel(*tasks)


async def test_a_request_withdrawn_in_its_step_has_its_held_hand_off_released():
    clock = ManualClock(T0)
    agent, client, _received, tasks = await start(clock)
    try:
        await client.send(Request(request_id=2, prompt_tokens=1000, output_tokens=8, sent_ns=T0))
        await clock.advance_ns(0)
        assert set(agent.handoffs.held) == {2}  # staged by its step, while the step runs
        await client.send(GONE)
        await clock.advance_ns(0)
        assert agent.handoffs.held == {}
        stats = agent.stats()
        assert stats["cancelled"] == {"queued": 0, "handoff": 1} and stats["handoffs_cancelled"] == 1
    finally:
        await cancel(*tasks)


class TwoSegments:
    """A streamed hand-off's frames: two layers of each of two token segments, one chunk each."""

    n_layers = 2
    n_segments = 2

    def layer_chunks(self, layer: int, segment: int = 0, release_ns: int = 0) -> list[KvChunk]:
        return [KvChunk(7, layer=layer, chunk=segment * 2 + layer, dtype=DType.BF16, shape=(8, 64), codec_id=0,
                        codec_header=b"", payload=PAYLOAD, raw_bytes=len(PAYLOAD), release_ns=release_ns)]


class OneChunk:
    """A whole hand-off's frames: one chunk."""

    n_layers = 1
    n_segments = 1

    def layer_chunks(self, layer: int, segment: int = 0, release_ns: int = 0) -> list[KvChunk]:
        return [KvChunk(8, layer=0, chunk=0, dtype=DType.BF16, shape=(8, 64), codec_id=0, codec_header=b"",
                        payload=PAYLOAD, raw_bytes=len(PAYLOAD))]


async def test_a_stream_going_out_when_its_client_leaves_stops_and_is_aborted_with_an_error_naming_it():
    clock = ManualClock(T0)
    link, middlebox, client, registry = await prefill_link_to_memory_middlebox(clock)
    request = Request(request_id=7, prompt_tokens=8, output_tokens=4, sent_ns=T0)
    begin = KvBegin(7, prompt_tokens=8, output_tokens=4, n_layers=2, n_chunks=4, raw_bytes=4 * len(PAYLOAD),
                    codec="none", first_token_ns=0)
    # Chunked prefill's first chunk has run; the second chunk's step is never planned: its client leaves first.
    schedule = ReleaseSchedule(HANDOFF_LAYERWISE, 2, (4, 8))
    schedule.plan(4, StepWindow(T0, 1_000_000))
    run = asyncio.create_task(link.run())
    try:
        link.hold(HeldHandoff(request, client, begin, TwoSegments(), deadline_ns=T0 + 10**12, schedule=schedule))
        got = [await middlebox.next_event() for _ in range(4)]  # Hello, KvBegin, the first segment's two chunks
        assert [type(e).__name__ for e in got] == ["Hello", "KvBegin", "KvChunk", "KvChunk"]
        assert link.cancel(7, "client gone")
        aborted = await middlebox.next_event()
        assert isinstance(aborted, Error) and (aborted.request_id, aborted.message) == (7, "client gone")
        assert len(middlebox.connection._received_kv) == 0  # the wire closed its stream at the Error
        assert link.held == {} and link.stats()["held_requests"] == 0
        assert registry.get_sample_value("kvtransit_prefill_kv_held_bytes") == 0
        assert not link.cancel(7, "client gone")  # once only
        assert not any(isinstance(e, KvEnd) for e in got)
        # The FIFO link is not held up by the withdrawn stream: the next hand-off goes out whole.
        link.hold(HeldHandoff(Request(request_id=8, prompt_tokens=8, output_tokens=4, sent_ns=T0), client,
                              KvBegin(8, prompt_tokens=8, output_tokens=4, n_layers=1, n_chunks=1,
                                      raw_bytes=len(PAYLOAD), codec="none", first_token_ns=T0),
                              OneChunk(), deadline_ns=T0 + 10**12))
        after = [await middlebox.next_event() for _ in range(3)]
        assert [(type(e).__name__, e.request_id) for e in after] == [("KvBegin", 8), ("KvChunk", 8), ("KvEnd", 8)]
    finally:
        await cancel(run)
