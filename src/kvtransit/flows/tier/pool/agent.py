"""The KV pool agent (`kvtransit kvpool`): a shared store of prefix KV blocks, by content hash.

It sits behind the middlebox (docs/reference.md §7.1): what reaches it crossed the
module and the shaped link. Per connection (role KVPOOL, the peer a MIDDLEBOX; docs/WIRE.md):
- `PoolFetch(id, hash_ids)` → `PoolHit(id, blocks, block_tokens)`, then, when blocks > 0, one KV stream under
  the same id: KvBegin (prompt_tokens = blocks × block_tokens), each block's chunks in order (exactly as
  stored: compact when the link compresses), KvEnd.
- `PoolPut(id, hash_ids)`, then a KV stream of those blocks, n_chunks / len(hash_ids) consecutive chunks each
  → stored, then `Ack(id, OK, "stored k of n")`. A stream whose chunks do not split evenly into its blocks
  (or with no PoolPut before it) is refused with an Error naming the request; its bytes are dropped.

The put stream is read by `flows/tier/pool_stream.py: PutAssembler`, as the middlebox's pool path reads it;
a put its source gives up on (an Error naming it, before or after its KvBegin) counts as failed. Storage
rules (capacity, LRU, disk tier, CRC32C on read) are `store.BlockStore`'s. Capacities are given in model bytes
(the KV at full size) and held at the run's payload scale, like everything else. The pool keeps no time of its
own (its LRU is by use order, not by clock), so it takes no Clock.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from kvtransit.agents.plugins import flow_parts
from kvtransit.agents.process import Address, new_registry
from kvtransit.agents.skeleton import AgentContext, Part
from kvtransit.flows.tier.metrics import KvPoolMetrics, kvpool_metrics
from kvtransit.flows.tier.pool.store import BlockStore, StoredChunk, split_into_blocks
from kvtransit.flows.tier.pool.warm import WarmReport, warm
from kvtransit.flows.tier.pool_stream import (
    OpenPut,
    PutAborted,
    PutAssembler,
    PutChunk,
    PutEnded,
    PutOpened,
    PutStep,
    PutWithdrawn,
)
from kvtransit.flows.tier.section import TierSection
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.traces import BLOCK_TOKENS
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.errors import ErrorCode, ProtocolError
from kvtransit.wire.events import Ack, AckStatus, Bye, Error, Hello, KvBegin, KvChunk, PoolFetch, PoolHit, Role
from kvtransit.wire.limits import WIRE_VERSION, clip_message, clip_reason

log = logging.getLogger(__name__)

TIERS = ("memory", "disk")


class KvPool:
    """The pool's protocol side, over a BlockStore (no sockets here: `serve` is handed each connection)."""

    def __init__(self, store: BlockStore, *, registry=None, model_bytes_per_byte: float = 1.0,
                 block_tokens: int = BLOCK_TOKENS, name: str = "kvpool-0"):
        self.store = store
        self.name = name
        self.block_tokens = block_tokens
        self.model_bytes_per_byte = model_bytes_per_byte
        self.metrics = kvpool_metrics(registry) if registry is not None else None
        self.lookups = {"hit": 0, "partial": 0, "miss": 0}
        self.served_bytes = 0
        self.served_raw_bytes = 0
        if self.metrics is not None:
            self._declare_series(self.metrics)

    def _declare_series(self, m: KvPoolMetrics) -> None:
        for tier in TIERS:
            m.blocks.labels(stage=tier).set_function(partial(self._occupancy, tier, "blocks"))
            m.stored_bytes.labels(stage=tier).set_function(partial(self._occupancy_model_bytes, tier, "bytes"))
            m.capacity_bytes.labels(stage=tier).set_function(
                partial(self._occupancy_model_bytes, tier, "capacity_bytes"))
        for outcome in self.lookups:
            m.lookups.labels(outcome=outcome)

    def _occupancy(self, tier: str, key: str) -> float:
        return self.store.occupancy().get(tier, {}).get(key, 0)

    def _occupancy_model_bytes(self, tier: str, key: str) -> float:
        """A byte figure of the store, in model bytes (the store holds blocks at the run's payload scale)."""
        return self._occupancy(tier, key) * self.model_bytes_per_byte

    def _sync_counters(self, before: dict) -> None:
        """Move the store's counters' growth onto the Prometheus counters."""
        if self.metrics is None:
            return
        c, m = self.store.counters, self.metrics
        for tier in TIERS:
            m.evictions.labels(stage=tier).inc(c.evictions[tier] - before["evictions"][tier])
            m.blocks_served.labels(stage=tier).inc(c.served[tier] - before["served"][tier])
        for outcome in c.put:
            m.blocks_put.labels(outcome=outcome).inc(c.put[outcome] - before["put"][outcome])
        m.bad_blocks.labels(stage="disk").inc(c.bad_blocks - before["bad_blocks"])

    def _snapshot(self) -> dict:
        c = self.store.counters
        return {"evictions": dict(c.evictions), "served": dict(c.served), "put": dict(c.put),
                "bad_blocks": c.bad_blocks}

    # -- one connection ---------------------------------------------------------------------------------

    async def serve(self, endpoint: Endpoint) -> None:
        await endpoint.send(Hello(role=Role.KVPOOL, version=WIRE_VERSION, name=self.name))
        puts = PutAssembler()
        try:
            async for event in endpoint:
                match event:
                    case PoolFetch():
                        await self._fetch(endpoint, event)
                    case Bye():
                        break
                    case _:
                        await self._put_step(endpoint, puts.receive(event))
        except (ProtocolError, ConnectionError) as exc:
            log.warning("pool client %s: %s", endpoint.peername, exc)

    async def _put_step(self, endpoint: Endpoint, step: PutStep | None) -> None:
        match step:
            case PutOpened(put):
                await self._put_begin(endpoint, put)
            case PutChunk(put, chunk) if put.refused is None:
                put.chunks.append(StoredChunk.of(chunk))
            case PutEnded(put) if put.refused is None:
                await self._put_end(endpoint, put)
            case PutAborted() | PutWithdrawn():  # its source gave up, after its KvBegin or before
                self.store.counters.put["failed"] += 1
                if self.metrics is not None:
                    self.metrics.blocks_put.labels(outcome="failed").inc()

    async def _fetch(self, endpoint: Endpoint, fetch: PoolFetch) -> None:
        before = self._snapshot()
        blocks = self.store.fetch(fetch.hash_ids)
        self._sync_counters(before)
        outcome = "miss" if not blocks else "hit" if len(blocks) == len(fetch.hash_ids) else "partial"
        self.lookups[outcome] += 1
        if self.metrics is not None:
            self.metrics.lookups.labels(outcome=outcome).inc()
        rid = fetch.request_id
        await endpoint.send(PoolHit(request_id=rid, blocks=len(blocks), block_tokens=self.block_tokens))
        if not blocks:
            return
        chunks = [c for block in blocks for c in block.chunks]
        await endpoint.send(KvBegin(request_id=rid, prompt_tokens=len(blocks) * self.block_tokens, output_tokens=1,
                                    n_layers=max(c.layer for c in chunks) + 1, n_chunks=len(chunks),
                                    raw_bytes=sum(c.raw_bytes for c in chunks), codec=blocks[0].codec,
                                    first_token_ns=0))
        for index, c in enumerate(chunks):
            await endpoint.send(KvChunk(request_id=rid, layer=c.layer, chunk=index, dtype=c.dtype, shape=c.shape,
                                        codec_id=c.codec_id, codec_header=c.codec_header, payload=c.payload,
                                        raw_bytes=c.raw_bytes, payload_crc=c.payload_crc))
            self.served_bytes += len(c.payload)
            self.served_raw_bytes += c.raw_bytes
            if self.metrics is not None:
                self.metrics.served_bytes.labels(codec=blocks[0].codec).inc(len(c.payload) * self.model_bytes_per_byte)
        await endpoint.send(endpoint.connection.kv_end(rid))

    async def _put_begin(self, endpoint: Endpoint, put: OpenPut) -> None:
        rid, n_chunks = put.request_id, put.begin.n_chunks
        if not put.hash_ids:
            put.refused = f"KvBegin for request {rid} without a PoolPut naming its blocks"
        elif n_chunks % len(put.hash_ids):
            put.refused = (f"put of request {rid}: {n_chunks} chunks do not split evenly into its "
                           f"{len(put.hash_ids)} blocks")
        if put.refused:
            log.warning(put.refused)
            await endpoint.send(Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(put.refused),
                                      request_id=rid))

    async def _put_end(self, endpoint: Endpoint, put: OpenPut) -> None:
        blocks = split_into_blocks(put.hash_ids, put.begin.codec, put.chunks,
                                   per_block=put.begin.n_chunks // len(put.hash_ids))
        before = self._snapshot()
        stored = self.store.put(blocks)
        self._sync_counters(before)
        await endpoint.send(Ack(request_id=put.request_id, status=AckStatus.OK,
                                detail=clip_reason(f"stored {stored} of {len(blocks)}")))

    def stats(self) -> dict:
        c = self.store.counters
        return {"role": "kvpool", "name": self.name, "tiers": self.store.occupancy(),
                "lookups": dict(self.lookups), "served_bytes": self.served_bytes,
                "served_raw_bytes": self.served_raw_bytes, "evictions": dict(c.evictions),
                "blocks_served": dict(c.served), "blocks_put": dict(c.put), "bad_blocks": c.bad_blocks,
                "model_bytes_per_byte": self.model_bytes_per_byte}


class KvPoolAgent:
    """The KV pool process: its store and its port on the skeleton's lifecycle (agents/skeleton.py); a flow built on
    the tier plugs in parts of its own (selection's remote contexts, on a second port)."""

    role = "kvpool"

    def __init__(self, scenario: Scenario, *, name: str, listen: Address, metrics_listen: Address,
                 capacity_bytes: float, disk_dir: str | None = None, disk_capacity_bytes: float = 0.0):
        scale = scenario.effective_scale
        self.registry, _shared = new_registry("kvpool")
        # Capacities are model bytes; the pool holds blocks at the run's payload scale.
        store = BlockStore(int(capacity_bytes * scale), disk_dir=disk_dir, disk_bytes=int(disk_capacity_bytes * scale))
        self.pool = KvPool(store, registry=self.registry, model_bytes_per_byte=1.0 / scale, name=name)
        self.name = name
        self.listen_address, self.metrics_listen = listen, metrics_listen
        self.scale = scale
        self.scenario = scenario
        self.warmed: WarmReport | None = None
        self.parts: list[Part] = flow_parts("kvpool", self, {})

    def stats(self) -> dict:
        warmed = {"warm": self.warmed.as_dict(1.0 / self.scale)} if self.warmed is not None else {}
        return {**self.pool.stats(), **warmed}

    async def start(self, ctx: AgentContext) -> None:
        if TierSection.of(self.scenario).pool_warm == "trace":  # before anything can reach the pool (warm.py)
            self.warmed = await asyncio.to_thread(warm, self.scenario, self.pool.store)
            log.info("warmed with %d blocks of the trace's first %d requests in %.1f s", self.warmed.blocks,
                     self.warmed.earlier_requests, self.warmed.host_s)
        await ctx.listen(self.listen_address, "--listen", self.pool.serve, Role.KVPOOL, Role.MIDDLEBOX,
                         port_key="listen_port")

    def main_loops(self) -> dict:
        return {}

    async def stopping(self) -> None:
        pass
