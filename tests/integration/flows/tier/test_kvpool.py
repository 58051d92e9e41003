"""The KV tier end to end on loopback: the pool agent, the middlebox's pool path, the prefill's prefix reuse.

In-process tests run the real KvPool, Middlebox + PoolRelay and PrefixReuse over real sockets; the live test
runs `kvtransit kvpool` and two `kvtransit middlebox` processes (without and with the band-keep kernel) and
holds the fetch-time difference against the link model (docs/reference.md §2). The decode side is not part of
these paths: the middleboxes get an idle decode peer that only says Hello.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.process import Address
from kvtransit.flows.tier.middlebox_pool import PoolRelay
from kvtransit.flows.tier.pool.agent import KvPool
from kvtransit.flows.tier.pool.store import BlockStore
from kvtransit.flows.tier.prefix import chain
from kvtransit.flows.tier.prefix_cache import PrefixReuse
from kvtransit.flows.tier.section import TierSection
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.cost.roofline import prefill_step_cached_s
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.traces import BLOCK_TOKENS
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.transport import serve
from kvtransit.wire.events import Hello, Request, Role
from kvtransit.wire.limits import WIRE_VERSION

pytestmark = pytest.mark.timeout(120)


def _prefix(name: str, blocks: int) -> tuple[int, ...]:
    return chain([(name, k) for k in range(blocks)])


def _request(rid: int, ids: tuple[int, ...], suffix: int = 100) -> Request:
    return Request(rid, len(ids) * BLOCK_TOKENS + suffix, 8, 0, hash_ids=ids)


def _reuse(scenario: Scenario, port: int) -> PrefixReuse:
    layout = scenario.kv_layout
    kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed)
    return PrefixReuse(scenario, registry=CollectorRegistry(), kv=kv, clock=MonotonicClock(),
                       pool_via=Address("127.0.0.1", port))


@contextlib.asynccontextmanager
async def pool_path(scenario: Scenario, *, store: BlockStore | None = None):
    """pool ← middlebox pool relay ← (yielded) prefill-side PrefixReuse, all real, on loopback."""
    store = store or BlockStore(int(TierSection.of(scenario).kv_pool_capacity * scenario.effective_scale))
    pool = KvPool(store, registry=CollectorRegistry(), model_bytes_per_byte=1 / scenario.effective_scale)
    pool_server = await serve("127.0.0.1", 0, pool.serve, Role.KVPOOL, Role.MIDDLEBOX)
    mb = Middlebox(scenario, [], registry=CollectorRegistry())
    relay = PoolRelay(mb, "127.0.0.1", pool_server.port, registry=CollectorRegistry())
    relay_server = await serve("127.0.0.1", 0, relay.handle_prefill, Role.MIDDLEBOX, Role.PREFILL)
    reuse = _reuse(scenario, relay_server.port)
    try:
        yield pool, pool_server, relay, reuse
    finally:
        await reuse.close()
        await relay.close()
        await relay_server.shutdown(1.0)
        await pool_server.shutdown(1.0)
        await mb.close()


async def _write_back(reuse: PrefixReuse, rid: int, ids: tuple[int, ...]):
    lookup = await reuse.lookup(_request(rid, ids))
    reuse.write_back(rid, lookup)
    await reuse.write_backs_settled()
    return lookup


async def test_a_written_back_prefix_comes_back_through_the_middlebox_compressed_once():
    scenario = Scenario.build(link="eth-100g", codec="freq-keep-k", kv_pool="pool")
    ids = _prefix("system", 4)
    async with pool_path(scenario) as (pool, _server, relay, reuse):
        first = await _write_back(reuse, 1, ids)
        assert (first.outcome, first.hit_blocks) == ("miss", 0)
        second = await reuse.lookup(_request(2, ids, suffix=37))
        assert (second.outcome, second.hit_blocks, second.cached_tokens) == ("hit", 4, 4 * BLOCK_TOKENS)
        # The pool holds the kernel's compact form (payloads and codec headers); the fetch crosses the link at
        # the payloads' size.
        held = pool.store.occupancy()["memory"]["bytes"]
        assert second.wire_bytes < held < second.wire_bytes * 1.01
        assert second.raw_bytes == 4 * BLOCK_TOKENS * scenario.kv_layout.bytes_per_token
        assert second.wire_bytes / second.raw_bytes == pytest.approx(0.5, abs=0.02)  # keep 0.5, 4 sinks a block
        assert relay.stats()["put_wire_bytes"] == second.wire_bytes  # compressed once, on the way out
        assert second.fetch_s > second.wire_bytes / scenario.scaled_link.bandwidth_Bps
    stats = reuse.stats()
    assert stats["hit_rate"] == pytest.approx(4 * BLOCK_TOKENS / (2 * 4 * BLOCK_TOKENS + 137))
    assert stats["writebacks"] == {"ok": 1, "failed": 0}


async def test_with_the_pool_unreachable_the_prefill_recomputes_and_counts_why():
    scenario = Scenario.build(link="eth-100g", codec="none", kv_pool="pool")
    async with pool_path(scenario) as (_pool, pool_server, _relay, reuse):
        await pool_server.shutdown(0.5)  # the pool goes away behind the middlebox
        lookup = await reuse.lookup(_request(1, _prefix("a", 2)))
        assert (lookup.outcome, lookup.cached_tokens) == ("fetch-failed", 0)
    # No middlebox at all: nothing to dial.
    closed = await serve("127.0.0.1", 0, lambda e: asyncio.sleep(0), Role.MIDDLEBOX, Role.PREFILL)
    port = closed.port
    await closed.shutdown(0.1)
    reuse = _reuse(scenario, port)
    lookup = await reuse.lookup(_request(2, _prefix("a", 2)))
    assert (lookup.outcome, lookup.cached_tokens) == ("pool-down", 0)
    assert reuse.stats()["lookups"]["pool-down"] == 1
    await reuse.close()


async def test_a_block_that_fails_its_checksum_is_missed_recomputed_and_written_again(tmp_path):
    scenario = Scenario.build(link="eth-100g", codec="none", kv_pool="pool")
    store = BlockStore(0, disk_dir=tmp_path, disk_bytes=10**9)  # no memory tier: every fetch reads the disk
    ids = _prefix("doc", 4)
    async with pool_path(scenario, store=store) as (pool, _server, _relay, reuse):
        await _write_back(reuse, 1, ids)
        path = store.disk_path(ids[2])
        damaged = bytearray(path.read_bytes())
        damaged[-100] ^= 0x40
        path.write_bytes(bytes(damaged))
        lookup = await reuse.lookup(_request(2, ids))
        assert (lookup.hit_blocks, lookup.cached_tokens) == (2, 2 * BLOCK_TOKENS)  # the bad block is a miss
        assert pool.stats()["bad_blocks"] == 1
        reuse.write_back(2, lookup)  # blocks 2 and 3 recomputed and written back
        await reuse.write_backs_settled()
        assert (await reuse.lookup(_request(3, ids))).hit_blocks == 4


async def test_local_mode_reuses_without_a_pool_or_a_fetch():
    scenario = Scenario.build(kv_pool="local")
    reuse = _reuse(scenario, 1)  # never dialled
    ids = _prefix("s", 4)
    reuse.write_back(1, await reuse.lookup(_request(1, ids)))
    lookup = await reuse.lookup(_request(2, ids))
    assert (lookup.outcome, lookup.cached_tokens, lookup.fetch_s, lookup.wire_bytes) == ("hit", 2048, 0.0, 0)


# -- live: real processes, the fetch time against the link model ------------------------------------------

async def _start(argv: list[str]) -> tuple[asyncio.subprocess.Process, dict]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    if not line.startswith("KVTRANSIT-READY "):
        proc.kill()
        raise AssertionError(f"{argv[3]} did not start: {line!r} {(await proc.stderr.read()).decode()[-2000:]}")
    return proc, json.loads(line.removeprefix("KVTRANSIT-READY "))


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def test_the_kernel_shortens_pool_fetches_by_what_the_link_model_says():
    """eth-100g, light load (one fetch at a time): TTFT = fetch + the cached-prefix prefill step, and the step
    is the same with and without the kernel, so the TTFT difference is the fetch difference, which the link
    model puts at (raw - wire) / bandwidth. Held within 5 %. Each side is the fastest of 11 fetches: what the
    shared 2-core box adds (a late wake-up, another process's turn) only ever adds time, so the minimum is the
    fetch with the least of it (measured: 42.6 ms modelled, 42.6-42.9 ms measured)."""
    base = Scenario.build(link="eth-100g", kv_pool="pool", codec="none")
    cli = [sys.executable, "-m", "kvtransit.cli"]
    procs = []

    async def idle_decode(endpoint):
        await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name="idle-decode"))
        async for _ in endpoint:
            pass

    decode = await serve("127.0.0.1", 0, idle_decode, Role.DECODE, Role.MIDDLEBOX)
    try:
        pool, pool_ready = await _start([*cli, "kvpool", *base.to_argv()])
        procs.append(pool)
        fetch_s, wire, raw = {}, {}, {}
        for codec in ("none", "freq-keep-k"):
            scenario = Scenario.build(link="eth-100g", kv_pool="pool", codec=codec)
            mb, ready = await _start([*cli, "middlebox", *scenario.to_argv(), "--decode", f"127.0.0.1:{decode.port}",
                                      "--kvpool", f"127.0.0.1:{pool_ready['listen_port']}"])
            procs.append(mb)
            reuse = _reuse(scenario, ready["pool_port"])
            ids = _prefix(codec, 16)  # 8,192 cached tokens: 16 MiB at this scale, 86 ms raw over eth-100g
            await _write_back(reuse, 1, ids)
            samples = []
            for rid in range(2, 13):
                lookup = await reuse.lookup(_request(rid, ids))
                assert lookup.hit_blocks == 16
                samples.append(lookup.fetch_s)
            fetch_s[codec], wire[codec], raw[codec] = min(samples), lookup.wire_bytes, lookup.raw_bytes
            await reuse.close()
        step = prefill_step_cached_s(base.model_spec, base.device_spec, base.gpus, [(16 * BLOCK_TOKENS + 100,
                                                                                      16 * BLOCK_TOKENS)])
        ttft = {codec: fetch_s[codec] + step for codec in fetch_s}
        bandwidth = base.scaled_link.bandwidth_Bps
        modelled = (wire["none"] - wire["freq-keep-k"]) / bandwidth
        assert raw["none"] == raw["freq-keep-k"] == wire["none"]
        assert ttft["none"] - ttft["freq-keep-k"] == pytest.approx(modelled, rel=0.05)
        # Each fetch itself: at least the link's time, and not far above it (host overhead, generous).
        for codec in fetch_s:
            link_s = base.scaled_link.latency_s + wire[codec] / bandwidth
            assert link_s <= fetch_s[codec] < link_s * 1.5 + 0.01
    finally:
        for proc in reversed(procs):
            await _stop(proc)
        await decode.shutdown(1.0)
