"""The pool's protocol side (flows/tier/pool/agent.py: KvPool) over an in-memory connection, as the middlebox speaks
to it: how it counts the write-backs it does not store."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from kvtransit.flows.tier.pool.agent import KvPool
from kvtransit.flows.tier.pool.store import BlockStore
from kvtransit.wire import ErrorCode
from kvtransit.wire.events import Bye, Error, PoolPut, Role
from tests.unit._manual_time import greeted_pair
from tests.unit._wire_samples import kv_stream

SERVE_TIMEOUT_S = 5.0  # a hang guard only: the pool answers an in-memory peer at once


def failed_puts(pool: KvPool, registry: CollectorRegistry) -> tuple[int, float | None]:
    """The failed-put count as /stats and as Prometheus show it."""
    return (pool.stats()["blocks_put"]["failed"],
            registry.get_sample_value("kvtransit_kvpool_blocks_put_total", {"outcome": "failed"}))


async def test_a_put_withdrawn_before_its_kv_begin_counts_as_failed():
    registry = CollectorRegistry()
    pool = KvPool(BlockStore(10**9), registry=registry)
    middlebox, served = await greeted_pair(Role.MIDDLEBOX, Role.KVPOOL, pool.serve)
    await middlebox.send(PoolPut(5, (1, 2)))
    await middlebox.send(Error(ErrorCode.REQUEST_FAILED, "prefill gave up", request_id=5))
    await middlebox.send(Bye("done"))
    await asyncio.wait_for(served, SERVE_TIMEOUT_S)
    assert failed_puts(pool, registry) == (1, 1.0)


async def test_a_put_aborted_after_its_kv_begin_counts_as_failed():
    registry = CollectorRegistry()
    pool = KvPool(BlockStore(10**9), registry=registry)
    middlebox, served = await greeted_pair(Role.MIDDLEBOX, Role.KVPOOL, pool.serve)
    begin, chunk = kv_stream(6, 1)
    await middlebox.send(PoolPut(6, (1,)))
    await middlebox.send(begin)
    await middlebox.send(chunk)
    await middlebox.send(Error(ErrorCode.REQUEST_FAILED, "kernel refused it", request_id=6))
    await middlebox.send(Bye("done"))
    await asyncio.wait_for(served, SERVE_TIMEOUT_S)
    assert failed_puts(pool, registry) == (1, 1.0)
    assert pool.stats()["blocks_put"]["stored"] == 0
