"""Layer-wise KV streaming through the real agents on a ManualClock, in memory: the prefill stamps each
layer with when its compute ends, the middlebox holds each until then, decode takes the request at its last layer,
and a prefill that fails mid-step releases no further layer. No sockets, no sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest
from prometheus_client import CollectorRegistry

from kvtransit.agents.decode.agent import DecodeAgent
from kvtransit.agents.decode.incoming import Arrived, Incoming
from kvtransit.agents.decode.link_meter import streamed_idle_ns
from kvtransit.agents.middlebox import decode_peers
from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.prefill.agent import PrefillAgent
from kvtransit.agents.prefill.handoff_frames import HandoffFrames
from kvtransit.agents.process import Address
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import StepWindow
from kvtransit.model.serving.prefill_plan import BatchEntry, plan_prefill_step
from kvtransit.runtime.clock import ManualClock
from kvtransit.runtime.transport import Endpoint, serve_memory
from kvtransit.wire.events import DType, Error, FirstToken, Hello, KvBegin, KvChunk, KvEnd, Request, Role
from tests._endpoints import hello

from ._manual_time import cancel, collect, count_loop_turns, greeted_pair

ANY = Address("127.0.0.1", 0)
T0 = 10**12  # a clock far from 0, as CLOCK_MONOTONIC is
LAYERWISE = Scenario(codec="none", dilation=2.0, handoff="layerwise")
CHUNKED = Scenario(codec="none", dilation=2.0, handoff="layerwise", prefill_chunk=512)


def wall_ns(scenario: Scenario, *entries: BatchEntry) -> int:
    return round(plan_prefill_step(scenario, list(entries)).wall_s * 1e9)


async def start_prefill(scenario: Scenario, clock: ManualClock):
    agent = PrefillAgent(scenario, name="prefill-test", listen=ANY, kv_to=ANY, metrics_listen=ANY, clock=clock)
    client, serving = await greeted_pair(Role.LOADGEN, Role.PREFILL, agent.serve_client)
    received: list = []
    tasks = [serving, collect(client, clock, received), asyncio.create_task(agent.step_loop())]
    return agent, client, received, tasks


def first_tokens(received) -> dict[int, int]:
    return {e.request_id: e.t_ns for e, _ in received if isinstance(e, FirstToken)}


def layer_releases(start_ns: int, end_ns: int, layers: int) -> list[int]:
    return [start_ns + (layer + 1) * (end_ns - start_ns) // layers for layer in range(layers)]


# --- the prefill: release times follow the step ------------------------------------------------------------------

async def test_each_layer_is_stamped_with_when_its_compute_ends_and_the_last_with_the_first_token():
    clock = ManualClock(T0)
    agent, client, received, tasks = await start_prefill(LAYERWISE, clock)
    try:
        await client.send(Request(request_id=1, prompt_tokens=1000, output_tokens=8, sent_ns=T0))
        await clock.advance_ns(0)
        deadline = T0 + wall_ns(LAYERWISE, BatchEntry(1, 1000, 8))
        held = agent.handoffs.held[1]
        assert held.begin.first_token_ns == deadline
        layers = LAYERWISE.kv_layout.layers
        releases = layer_releases(T0, deadline, layers)
        # An idle link: its first layer made inside the step, to go out at once; the others as the link sends them.
        assert held.made is not None and held.eager
        assert {c.layer for c in held.made} == {0} and {c.release_ns for c in held.made} == {releases[0]}
        recipe = [c.release_ns for layer in range(layers) for c in held.frames.layer_chunks(layer, 0, releases[layer])]
        assert sorted(set(recipe)) == releases
        await clock.advance_ns(deadline - T0)
        assert first_tokens(received) == {1: deadline} == {1: releases[-1]}
    finally:
        await cancel(*tasks)


async def test_a_back_to_back_steps_layers_follow_its_own_step_from_the_deadline_before():
    clock = ManualClock(T0)
    agent, client, _received, tasks = await start_prefill(LAYERWISE, clock)
    try:
        await client.send(Request(request_id=1, prompt_tokens=2000, output_tokens=8, sent_ns=T0))
        first = T0 + wall_ns(LAYERWISE, BatchEntry(1, 2000, 8))
        await clock.advance_ns((first - T0) // 2)
        await client.send(Request(request_id=2, prompt_tokens=500, output_tokens=8, sent_ns=clock.now_ns()))
        await clock.advance_ns(first - clock.now_ns())
        # Step k ends at t0 + the sum of the holds before it (DeadlineSchedule).
        second = T0 + round((plan_prefill_step(LAYERWISE, [BatchEntry(1, 2000, 8)]).wall_s
                             + plan_prefill_step(LAYERWISE, [BatchEntry(2, 500, 8)]).wall_s) * 1e9)
        held = agent.handoffs.held[2]
        # Behind request 1 on the link, request 2 is a recipe: its frames are made when the link reaches it.
        chunks = [c for layer in range(held.frames.n_layers)
                  for c in held.frames.layer_chunks(layer, 0, held.schedule.release_ns(0, layer))]
        assert [c.release_ns for c in chunks] == layer_releases(first, second, LAYERWISE.kv_layout.layers)
        assert held.begin.first_token_ns == second
    finally:
        await cancel(*tasks)


async def test_chunked_prefill_releases_each_chunks_kv_within_its_own_step_and_the_first_token_after_the_last():
    clock = ManualClock(T0)
    agent, client, received, tasks = await start_prefill(CHUNKED, clock)
    layers = CHUNKED.kv_layout.layers
    try:
        await client.send(Request(request_id=1, prompt_tokens=1200, output_tokens=8, sent_ns=T0))
        await clock.advance_ns(0)
        ends, held_s = [T0], 0.0
        for start, stop in ((0, 512), (512, 1024), (1024, 1200)):
            entry = BatchEntry(1, stop, 8, start, first_chunk=start == 0, last_chunk=stop == 1200)
            held_s += plan_prefill_step(CHUNKED, [entry]).wall_s
            ends.append(T0 + round(held_s * 1e9))  # step k ends at t0 + the sum of the holds (DeadlineSchedule)
        held = agent.handoffs.held[1]
        # Staged with the first chunk: its first token is not planned yet, every segment's frames are counted.
        assert held.begin.first_token_ns == 0 and held.begin.n_chunks == 3 * layers
        assert [c.release_ns for c in held.made] == layer_releases(ends[0], ends[1], layers)[:1]  # its first layer
        assert held.schedule.windows[1:] == [None, None]  # later chunks' KV does not exist yet
        await clock.advance_ns(ends[1] - T0)
        assert held.schedule.windows[1] == StepWindow(ends[1], ends[2] - ends[1])
        second = held.frames.layer_chunks(3, 1, held.schedule.release_ns(1, 3))
        assert [(c.chunk, c.shape[1], c.release_ns) for c in second] == [
            (layers + 3, 512, layer_releases(ends[1], ends[2], layers)[3])]
        assert first_tokens(received) == {}
        await clock.advance_ns(ends[3] - ends[1])
        assert first_tokens(received) == {1: ends[3]}
        assert held.schedule.release_ns(2, layers - 1) == ends[3]
    finally:
        await cancel(*tasks)


# --- the middlebox and decode: held until release, taken at the last layer ----------------------------------------

LAYERS, ROWS, TOKENS, HEAD_DIM = 8, 4, 16, 8
PAYLOAD = bytes(ROWS * TOKENS * HEAD_DIM * 2)  # BF16
LAYER_NS = 1_000_000


class Arrivals(Endpoint):
    """Decode's end of the link, noting (what, layer, when) for each KV frame and Error it receives."""

    def __init__(self, endpoint: Endpoint, clock: ManualClock, log: list):
        super().__init__(endpoint)
        self.clock, self.log = clock, log

    async def next_event(self):
        event = await super().next_event()
        if isinstance(event, (KvChunk, KvEnd, Error)):
            self.log.append((type(event).__name__, getattr(event, "layer", None), self.clock.now_ns()))
        return event


@contextlib.asynccontextmanager
async def streamed_path(monkeypatch):
    """(prefill's endpoint to the middlebox, the decode agent, what reached decode, clock): all real, in memory."""
    clock, log = ManualClock(T0), []
    decode = DecodeAgent(LAYERWISE, name="decode-test", listen=ANY, client_listen=ANY, metrics_listen=ANY,
                         accuracy_sample=0, clock=clock)
    kv_server = serve_memory(lambda ep: decode.ingress.serve_kv(Arrivals(ep, clock, log)), Role.DECODE, Role.MIDDLEBOX)
    client_server = serve_memory(decode.serve_client, Role.DECODE, Role.LOADGEN)
    loadgen = await client_server.connect()  # decode takes KV only with a client to stream tokens to
    await loadgen.send(hello(Role.LOADGEN))
    assert isinstance(await loadgen.next_event(), Hello)

    async def dial_decode(host, port, ours, theirs, *, name, timeout_s):
        endpoint = await kv_server.connect()
        await endpoint.send(hello(ours, name))
        assert isinstance(await endpoint.next_event(), Hello)
        return endpoint

    monkeypatch.setattr(decode_peers, "open_greeted", dial_decode)
    middlebox = Middlebox(LAYERWISE, [("memory", 0)], registry=CollectorRegistry(), clock=clock)
    await middlebox.connect_decodes(1.0)
    prefill_server = serve_memory(middlebox.handle_prefill, Role.MIDDLEBOX, Role.PREFILL)
    prefill = await prefill_server.connect()
    await prefill.send(hello(Role.PREFILL))
    assert isinstance(await prefill.next_event(), Hello)
    try:
        yield prefill, decode, log, clock
    finally:
        prefill.abort()
        loadgen.abort()
        await middlebox.close()
        for server in (prefill_server, kv_server, client_server):
            await server.shutdown(1.0)


async def send_step(prefill: Endpoint, rid: int) -> list[int]:
    """What a layer-wise prefill sends at a step's start (T0): KvBegin, each layer stamped with its release time (a
    step of LAYERS × LAYER_NS), KvEnd. Returns the release times."""
    releases = [T0 + (layer + 1) * LAYER_NS for layer in range(LAYERS)]
    await prefill.send(KvBegin(request_id=rid, prompt_tokens=TOKENS, output_tokens=4, n_layers=LAYERS,
                               n_chunks=LAYERS, raw_bytes=LAYERS * len(PAYLOAD), codec="none",
                               first_token_ns=releases[-1]))
    for layer, release in enumerate(releases):
        await prefill.send(KvChunk(request_id=rid, layer=layer, chunk=layer, dtype=DType.BF16,
                                   shape=(ROWS, TOKENS, HEAD_DIM), codec_id=0, codec_header=b"", payload=PAYLOAD,
                                   raw_bytes=len(PAYLOAD), release_ns=release))
    await prefill.send(prefill.connection.kv_end(rid))
    return releases


async def test_each_layer_crosses_the_link_from_its_release_and_decode_takes_the_request_at_the_last(monkeypatch):
    async with streamed_path(monkeypatch) as (prefill, decode, log, clock):
        releases = await send_step(prefill, 1)
        await clock.advance_ns(LAYERS * LAYER_NS + 5_000_000)
        link = LAYERWISE.scaled_link
        latency_ns = round((link.latency_s + LAYERWISE.module.added_latency_s * LAYERWISE.effective_dilation) * 1e9)
        frame_ns = round(2 * len(PAYLOAD) / link.bandwidth_Bps * 1e9)  # a frame's bytes, headers and all, and then some
        chunks = [(layer, at) for kind, layer, at in log if kind == "KvChunk"]
        assert [layer for layer, _ in chunks] == list(range(LAYERS))
        for (layer, at), release in zip(chunks, releases, strict=True):
            assert release + latency_ns <= at <= release + latency_ns + frame_ns, (layer, at - release)
        (ready_ns,) = [at for kind, _, at in log if kind == "KvEnd"]
        assert ready_ns >= releases[-1] + latency_ns  # taken at its last layer, the first token's
        assert decode.ingress.handoffs == {"taken": 1, "duplicate": 0, "aborted": 0} and decode.batcher.waiting == 1
        split = decode.splits.by_request[1]
        assert split.hidden_bytes == (LAYERS - 1) * len(PAYLOAD)  # all but the last layer crossed in the step
        assert split.exposed_s == pytest.approx((ready_ns - releases[-1]) / 1e9 / LAYERWISE.effective_dilation)
        assert decode.splits.streamed_handoffs == 1 and len(decode.splits.streamed_pairs) == 1


async def test_the_middlebox_takes_a_burst_of_layers_one_per_loop_turn_so_a_release_due_meanwhile_is_on_time(
        monkeypatch):
    turns: list[int] = []
    seen: list[int] = []
    ingest = Middlebox._ingest_chunk

    async def noting(self, handoff, event):
        seen.append(len(turns))
        await ingest(self, handoff, event)

    monkeypatch.setattr(Middlebox, "_ingest_chunk", noting)

    async with streamed_path(monkeypatch) as (prefill, _decode, log, clock):
        probe = count_loop_turns(turns)
        try:
            await send_step(prefill, 1)  # every layer written at once: all buffered at the middlebox
            await clock.advance_ns(LAYERS * LAYER_NS + 5_000_000)
        finally:
            await cancel(probe)
        assert len(seen) == LAYERS and all(later > earlier for earlier, later in itertools.pairwise(seen))
        assert [layer for kind, layer, _ in log if kind == "KvChunk"] == list(range(LAYERS))


async def test_a_prefill_that_fails_mid_step_releases_no_further_layer_and_decode_holds_nothing_for_it(monkeypatch):
    async with streamed_path(monkeypatch) as (prefill, decode, log, clock):
        releases = await send_step(prefill, 1)  # its KvEnd too: the middlebox has every frame
        failed_at = T0 + 3 * LAYER_NS + LAYER_NS // 2  # layers 0-2 computed, then the prefill dies
        await clock.advance_ns(failed_at - T0)
        prefill.abort()
        await clock.advance_ns(LAYERS * LAYER_NS + 5_000_000)
        reached = [layer for kind, layer, _ in log if kind == "KvChunk"]
        assert reached == [layer for layer, release in enumerate(releases) if release <= failed_at] == [0, 1, 2]
        assert [kind for kind, _, _ in log][-1] == "Error"  # the stream was closed, not completed
        assert decode.ingress.handoffs == {"taken": 0, "duplicate": 0, "aborted": 1}
        assert decode.batcher.reserved_tokens == 0 and decode.batcher.waiting == 0 and 1 not in decode.arrivals
        assert decode.link.busy_ns >= 0 and decode.link.open_transfers == 0  # its stream closed at decode too


def test_a_streamed_hand_offs_idle_link_is_the_wait_for_each_layers_compute():
    began, latency = 0, 10
    arrived = [Arrived(at_ns=at, wire_bytes=1, raw_bytes=1, release_ns=release)
               for at, release in ((115, 100), (215, 200), (260, 200))]  # the third was due before the second was in
    assert streamed_idle_ns(began, arrived, latency) == (110 - 0) + (210 - 115) + 0
    assert streamed_idle_ns(began, [Arrived(5, 1, 1, 0)], latency) == 0  # whole mode: no gaps of its own


def _sampled_chunks(frames) -> list:
    return [(c.layer, c.codec_id, bytes(c.codec_header), bytes(c.payload), c.shape)
            for segment in range(frames.n_segments) for layer in range(frames.n_layers)
            for c in frames.layer_chunks(layer, segment)]


def test_decode_puts_a_chunked_prefills_segments_back_together_along_tokens_byte_for_byte():
    scenario = Scenario(codec="none", scale=0.0625)
    layout = scenario.kv_layout
    kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed)
    frames = HandoffFrames(request_id=3, tokens=1200, layout=layout, kv=kv, codec=None, codec_name="none",
                           stops=(512, 1024, 1200))
    begin = KvBegin(3, prompt_tokens=1200, output_tokens=4, n_layers=layout.layers, n_chunks=frames.n_chunks,
                    raw_bytes=layout.request_bytes(1200), codec="none", first_token_ns=1)
    chunks = _sampled_chunks(frames)
    in_order = DecodeAgent(scenario, name="decode-test", listen=ANY, client_listen=ANY, metrics_listen=ANY,
                           accuracy_sample=1)
    in_order.sample.measure(Incoming(begin, 0, sampled=True, chunks=chunks))
    assert in_order.sample.kv_content_mismatches() == 0 and in_order.sample.codec.relative("k") == 0.0
    # The segments out of token order are other bytes: the check would say so.
    per_segment = len(chunks) // 3
    shuffled = chunks[per_segment:2 * per_segment] + chunks[:per_segment] + chunks[2 * per_segment:]
    swapped = DecodeAgent(scenario, name="decode-test", listen=ANY, client_listen=ANY, metrics_listen=ANY,
                          accuracy_sample=1)
    swapped.sample.measure(Incoming(begin, 0, sampled=True, chunks=shuffled))
    assert swapped.sample.kv_content_mismatches() == 1
