"""The middlebox's write-back path (flows/tier/middlebox_pool.py) in memory: a real KvPool behind a real PoolRelay, the
prefill played by the test. The middlebox runs on a ManualClock, so the put lane stands still until the test moves
the clock: a lane as slow as a test needs, without sleeping."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.pipeline import ByteBudget
from kvtransit.flows.tier import middlebox_pool as pool_module
from kvtransit.flows.tier.middlebox_pool import PoolRelay
from kvtransit.flows.tier.pool.agent import KvPool
from kvtransit.flows.tier.pool.store import BlockStore
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import ManualClock
from kvtransit.runtime.transport import Endpoint, FlowLimits, serve_memory
from kvtransit.wire.events import Ack, AckStatus, Error, Hello, KvBegin, KvChunk, PoolPut, Role
from tests._endpoints import hello, kv_begin, kv_chunk

CHUNK_BYTES = 64 * 1024
# Small socket-like buffers on the prefill's connection, so a reader that stops is felt by the writer soon.
SMALL_BUFFERS = FlowLimits(write_high_bytes=CHUNK_BYTES, write_low_bytes=CHUNK_BYTES // 4,
                           read_high_bytes=CHUNK_BYTES)
CLOCK_STEP_S = 0.01  # model time per step while waiting for the lane (3 MiB at eth-25g's scaled rate: 64 ms)
MAX_CLOCK_STEPS = 1000


class PeakBudget(ByteBudget):
    """A ByteBudget that remembers the most it ever held."""

    made: ClassVar[list[PeakBudget]] = []

    def __init__(self, limit: int):
        super().__init__(limit)
        self.peak = 0
        PeakBudget.made.append(self)

    async def acquire(self, nbytes: int) -> None:
        await super().acquire(nbytes)
        self.peak = max(self.peak, self.used)


class PoolLog:
    """What the pool received on its connections from the relay, Hellos and chunks (payload views) aside."""

    def __init__(self) -> None:
        self.events: list = []
        self.error = asyncio.Event()  # set once an Error arrived


class Recorded(Endpoint):
    """The pool's end of a connection, noting what it receives in a PoolLog."""

    def __init__(self, endpoint: Endpoint, log: PoolLog):
        super().__init__(endpoint)
        self.log = log

    async def next_event(self) -> Any | None:
        event = await super().next_event()
        if event is not None and not isinstance(event, (Hello, KvChunk)):
            self.log.events.append(event)
            if isinstance(event, Error):
                self.log.error.set()
        return event


@contextlib.asynccontextmanager
async def write_back_path(scenario: Scenario, *, inflight_bytes: int):
    """(prefill endpoint, relay, pool, what the pool received, clock): pool ← relay ← prefill, all in memory."""
    clock = ManualClock()
    pool = KvPool(BlockStore(10**9), registry=CollectorRegistry())
    pool_received = PoolLog()

    async def serve_pool(endpoint: Endpoint) -> None:
        await pool.serve(Recorded(endpoint, pool_received))

    pool_server = serve_memory(serve_pool, Role.KVPOOL, Role.MIDDLEBOX)

    async def dial(name: str) -> Endpoint:
        endpoint = await pool_server.connect()
        await endpoint.send(hello(Role.MIDDLEBOX, name))
        assert isinstance(await endpoint.next_event(), Hello)
        return endpoint

    middlebox = Middlebox(scenario, [], registry=CollectorRegistry(), clock=clock, inflight_bytes=inflight_bytes)
    relay = PoolRelay(middlebox, "memory", 0, registry=CollectorRegistry(), dial=dial)
    relay_server = serve_memory(relay.handle_prefill, Role.MIDDLEBOX, Role.PREFILL, limits=SMALL_BUFFERS)
    prefill = await relay_server.connect()
    await prefill.send(hello(Role.PREFILL))
    assert isinstance(await prefill.next_event(), Hello)
    try:
        yield prefill, relay, pool, pool_received, clock
    finally:
        prefill.abort()
        await relay.close()
        await relay_server.shutdown(1.0)
        await pool_server.shutdown(1.0)
        await middlebox.close()


async def run_clock_until(clock: ManualClock, waiting: Awaitable) -> Any:
    """Move the clock in steps until `waiting` is done; its result."""
    task = asyncio.ensure_future(waiting)
    for _ in range(MAX_CLOCK_STEPS):
        if task.done():
            return task.result()
        await clock.advance(CLOCK_STEP_S)
    task.cancel()
    raise AssertionError(f"still waiting after {MAX_CLOCK_STEPS * CLOCK_STEP_S:.0f} s of model time")


async def test_a_slow_put_lane_makes_the_prefill_wait_with_bounded_memory(monkeypatch):
    monkeypatch.setattr(pool_module, "ByteBudget", PeakBudget)
    PeakBudget.made.clear()
    n_chunks, blocks, inflight = 48, 4, 4 * CHUNK_BYTES
    async with write_back_path(Scenario.build(codec="none", kv_pool="pool"), inflight_bytes=inflight) as (
            prefill, _relay, pool, _received, clock):
        await prefill.send(PoolPut(1, tuple(range(100, 100 + blocks))))
        await prefill.send(kv_begin(1, n_chunks * CHUNK_BYTES, n_chunks))
        sent = 0

        async def send_all() -> None:
            nonlocal sent
            for index in range(n_chunks):
                await prefill.send(kv_chunk(1, index, bytes(CHUNK_BYTES)))
                sent += 1
            await prefill.send(prefill.connection.kv_end(1))

        sending = asyncio.ensure_future(send_all())
        for _ in range(20):  # the lane does not move while the clock stands still: let everything else run
            await asyncio.sleep(0)
        await clock.advance(0)
        assert not sending.done() and sent < n_chunks  # the writer waits
        (budget,) = PeakBudget.made
        assert budget.used <= inflight

        ack = await run_clock_until(clock, prefill.next_event())
        await sending
        assert isinstance(ack, Ack) and (ack.request_id, ack.status) == (1, AckStatus.OK)
        assert ack.detail == f"stored {blocks} of {blocks}"
        assert pool.stats()["blocks_put"]["stored"] == blocks
        assert budget.peak <= inflight and budget.used == 0  # never more than the in-flight limit held


async def test_a_write_back_chunk_the_kernel_refuses_fails_the_put_at_the_pool_and_at_the_prefill():
    # The codec takes floating-point KV; a U8 chunk is refused by the kernel stage (a ConfigError).
    scenario = Scenario.build(codec="freq-keep-k", kv_pool="pool")
    async with write_back_path(scenario, inflight_bytes=4 * CHUNK_BYTES) as (prefill, relay, pool, received, clock):
        await prefill.send(PoolPut(9, (1,)))
        await prefill.send(kv_begin(9, 1024))
        await prefill.send(kv_chunk(9, 0, bytes(1024)))
        await prefill.send(prefill.connection.kv_end(9))
        ack = await run_clock_until(clock, prefill.next_event())
        assert isinstance(ack, Ack) and (ack.request_id, ack.status) == (9, AckStatus.FAILED)
        assert "kernel freq-keep-k refused request 9" in ack.detail
        await run_clock_until(clock, received.error.wait())
        assert [type(e) for e in received.events] == [PoolPut, KvBegin, Error]
        error = received.events[-1]
        assert error.request_id == 9 and "refused request 9" in error.message
        assert pool.stats()["blocks_put"] == {"stored": 0, "duplicate": 0, "failed": 1}
        assert (relay.stats()["failed"], relay.stats()["puts"]) == (1, 0)  # counted once, as failed

