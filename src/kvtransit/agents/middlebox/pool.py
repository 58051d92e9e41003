"""The middlebox's pool path: prefix KV between the prefill and the shared KV pool, over the module and a link.

    prefill ──PoolFetch──▶ middlebox ─────────────────────▶ kvpool
    prefill ◀──PoolHit + blocks (compact)── module ◀══link══ kvpool         (fetch: TTFT pays this)
    prefill ──PoolPut + raw blocks──▶ kernel ══link══▶ kvpool ──Ack──▶ prefill   (write-back, compressed once)

- **Write-back** (put): the prefill sends new blocks raw; each chunk runs down the same kernel → module
  stages as a hand-off (compressed once, on the way out), then over the put lane of the pool link to the
  pool, which stores the compact form. The pool's Ack is relayed to the prefill.
- **Fetch**: the pool streams the blocks as stored; they cross the fetch lane of the pool link at their wire
  (compact) size, paced by the link's rate and latency, and the module is charged the inverse transform
  (REFERENCE §5's pricing, the same `ModuleStage` as the forward direction: its modelled compute holds the
  link when the module is slower than the wire). The prefill accepts the compact form (the KV's content is
  not used by the emulated GPU; its raw size is in every chunk header).
- The pool link is the scenario's link (`--link`), shaped at the same scale and dilation as the hand-off
  link, with one lane per direction (full duplex), each a FIFO (REFERENCE §4 style).

A pool that cannot be reached or goes away fails the fetches and puts in flight with a reason (an Error
naming the request), so the prefill falls back to recomputing; it is redialled on the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace

from kvtransit.kernels import KernelInputError
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.egress import EgressShaper, TransferRecord
from kvtransit.runtime.metrics import pool_relay_metrics
from kvtransit.runtime.transport import Endpoint, open_endpoint
from kvtransit.wire import WIRE_VERSION, ErrorCode
from kvtransit.wire.errors import ProtocolError
from kvtransit.wire.events import (Ack, AckStatus, Bye, Error, Hello, KvBegin, KvChunk, KvEnd, PoolFetch, PoolHit,
                                   PoolPut, Role)

from .items import ChunkInFlight
from .stages.kernel import PLACEMENT_MODULE

log = logging.getLogger(__name__)

POOL_RETRY_S = 1.0  # after a failed dial, the next request waits at least this long before redialling


@dataclass
class _Put:
    hash_ids: tuple[int, ...]
    owner: Endpoint
    begin: KvBegin | None = None
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


_END = object()


class PoolRelay:
    """Owned by a Middlebox; shares its kernel and module stages, has its own two lanes to the pool."""

    def __init__(self, middlebox, pool_host: str, pool_port: int, *, registry):
        self.mb = middlebox
        self.pool_host, self.pool_port = pool_host, pool_port
        self.metrics = pool_relay_metrics(registry)
        scenario = middlebox.scenario
        shaped = scenario.scaled_link
        self.dilation = middlebox.dilation
        latency_s = shaped.latency_s + scenario.module.added_latency_s * self.dilation
        self.fetch_lane = EgressShaper(rate_Bps=shaped.bandwidth_Bps, latency_s=latency_s, clock=middlebox.clock,
                                       on_transfer_done=lambda r: self._lane_done("fetch", r))
        self.put_lane = EgressShaper(rate_Bps=shaped.bandwidth_Bps, latency_s=latency_s, clock=middlebox.clock,
                                     on_transfer_done=lambda r: self._lane_done("put", r))
        # Two connections to the pool, so a long write-back never holds a fetch behind it on one socket.
        self._fetch_conn: Endpoint | None = None
        self._put_conn: Endpoint | None = None
        self._dial_lock = asyncio.Lock()
        self._last_failed_dial = -POOL_RETRY_S
        self._fetch_owner: dict[int, Endpoint] = {}
        self._put_owner: dict[int, Endpoint] = {}
        self._tasks: set[asyncio.Task] = set()
        self.totals = {"fetches": 0, "fetch_raw_bytes": 0, "fetch_wire_bytes": 0, "puts": 0, "put_raw_bytes": 0,
                       "put_wire_bytes": 0, "failed": 0, "module_energy_j": 0.0, "module_ops": 0.0}
        for phase in ("fetch", "put"):
            for stage in ("raw", "wire"):
                self.metrics.bytes.labels(phase=phase, stage=stage)
            for outcome in ("ok", "failed"):
                self.metrics.requests.labels(phase=phase, outcome=outcome)

    def _lane_done(self, phase: str, record: TransferRecord) -> None:
        self.metrics.transfer_seconds.labels(phase=phase).observe((record.queue_s + record.transfer_s) / self.dilation)

    # -- the pool side ----------------------------------------------------------------------------------

    async def _pool(self) -> tuple[Endpoint, Endpoint]:
        """Both pool connections, dialled if need be (ConnectionError when the pool cannot be reached)."""
        async with self._dial_lock:
            if self._fetch_conn is not None and not self._fetch_conn.is_closing and \
                    self._put_conn is not None and not self._put_conn.is_closing:
                return self._fetch_conn, self._put_conn
            loop = asyncio.get_running_loop()
            if loop.time() - self._last_failed_dial < POOL_RETRY_S:
                raise ConnectionError(f"kvpool at {self.pool_host}:{self.pool_port} is down (retrying shortly)")
            for conn in (self._fetch_conn, self._put_conn):
                if conn is not None:
                    conn.abort()
            try:
                conns = []
                for lane in ("fetch", "put"):
                    conn = await open_endpoint(self.pool_host, self.pool_port, Role.MIDDLEBOX, Role.KVPOOL)
                    await conn.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name=f"{self.mb.name}-{lane}"))
                    first = await conn.next_event()
                    if not isinstance(first, Hello):
                        raise ConnectionError(f"the kvpool did not say Hello (got {first!r})")
                    conns.append(conn)
            except (ConnectionError, OSError, ProtocolError) as exc:
                self._last_failed_dial = loop.time()
                raise ConnectionError(f"kvpool at {self.pool_host}:{self.pool_port} unreachable: {exc}") from None
            self._fetch_conn, self._put_conn = conns
            self._spawn(self._read_fetches(self._fetch_conn), "pool fetch reader")
            self._spawn(self._read_put_acks(self._put_conn), "pool put reader")
            return self._fetch_conn, self._put_conn

    async def _read_fetches(self, conn: Endpoint) -> None:
        """The pool's fetch answers, one at a time, each relayed over the fetch lane to the prefill asking."""
        reason = "kvpool connection closed"
        try:
            while (event := await _from_pool(conn)) is not None:
                if isinstance(event, PoolHit):
                    await self._relay_fetch(conn, event)
                elif isinstance(event, Error) and event.request_id is not None:
                    await self._tell(self._fetch_owner.pop(event.request_id, None), event, "fetch")
                elif isinstance(event, Bye):
                    break
        except PoolLost as exc:
            reason = str(exc)
        finally:
            conn.abort()
            for rid, owner in list(self._fetch_owner.items()):
                await self._tell(owner, Error(code=ErrorCode.REQUEST_FAILED, message=reason, request_id=rid), "fetch")
            self._fetch_owner.clear()

    async def _relay_fetch(self, conn: Endpoint, hit: PoolHit) -> None:
        """One fetch answer: PoolHit, then (blocks > 0) its KV stream, over the fetch lane to the prefill."""
        rid = hit.request_id
        owner = self._fetch_owner.pop(rid, None)
        kernel = self.mb.kernel
        streaming = hit.blocks > 0  # the pool's KV stream for this fetch is still to be read
        # Every frame is paced from the answer's arrival (as the hand-off is from its first token): the time
        # this host spends reading the pool's frames is not charged on top of the link's.
        start_ns = self.mb.clock.now_ns()
        try:
            if owner is None or owner.is_closing:
                raise ConnectionError(f"the prefill that asked for fetch {rid} is gone")
            async with self.fetch_lane.transfer(owner, label=f"fetch {rid}") as link:
                await link.send(hit, ready_ns=start_ns)
                while streaming:
                    event = await _from_pool(conn)
                    if event is None:
                        raise PoolLost("kvpool closed mid-fetch")
                    if isinstance(event, KvBegin):
                        await link.send(event, ready_ns=start_ns)
                    elif isinstance(event, KvChunk):
                        item = ChunkInFlight(chunk=event, arrived_ns=self.mb.clock.now_ns(), raw_bytes=event.raw_bytes,
                                             codec=kernel.name if event.codec_id else "none",
                                             placement=PLACEMENT_MODULE if event.codec_id else "none")
                        # Decompressing on the way in costs the module what compressing did (the inverse
                        # transform, REFERENCE §5 pricing); a module slower than the wire holds the link.
                        item = self.mb.module_stage.process(item, kernel)
                        await link.send(event, ready_ns=start_ns, min_serialise_s=item.modelled_compute_s)
                        self._account("fetch", event.raw_bytes, len(event.payload), item)
                    elif isinstance(event, KvEnd):
                        streaming = False
                        await link.send(owner.connection.kv_end(rid), ready_ns=start_ns)
                    elif isinstance(event, Error):
                        streaming = False
                        await link.send(event)
                        self._count("fetch", "failed")
                        return
            self._count("fetch", "ok")
        except (ConnectionError, ProtocolError) as exc:  # the prefill's side; the pool's is PoolLost
            log.info("fetch %d not delivered: %s", rid, exc)
            self._count("fetch", "failed")
            while streaming:  # read the rest of the answer off the pool connection, and drop it
                event = await _from_pool(conn)
                if event is None:
                    raise PoolLost("kvpool closed mid-fetch") from None
                streaming = not isinstance(event, (KvEnd, Error))

    async def _read_put_acks(self, conn: Endpoint) -> None:
        reason = "kvpool connection closed"
        try:
            while (event := await _from_pool(conn)) is not None:
                if isinstance(event, Ack):
                    self._count("put", "ok" if event.status == AckStatus.OK else "failed")
                    await self._tell(self._put_owner.pop(event.request_id, None), event, None)
                elif isinstance(event, Error) and event.request_id is not None:
                    await self._tell(self._put_owner.pop(event.request_id, None), event, "put")
                elif isinstance(event, Bye):
                    break
        except PoolLost as exc:
            reason = str(exc)
        finally:
            conn.abort()
            for rid, owner in list(self._put_owner.items()):
                await self._tell(owner, Ack(request_id=rid, status=AckStatus.FAILED, detail=reason[:200]), "put")
            self._put_owner.clear()

    # -- the prefill side -------------------------------------------------------------------------------

    async def handle_prefill(self, endpoint: Endpoint) -> None:
        """One prefill's pool connection: fetches and write-backs in, answers out."""
        await endpoint.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name=self.mb.name))
        announced: dict[int, tuple[int, ...]] = {}
        puts: dict[int, _Put] = {}
        try:
            async for event in endpoint:
                if isinstance(event, PoolFetch):
                    await self._start_fetch(endpoint, event)
                elif isinstance(event, PoolPut):
                    announced[event.request_id] = event.hash_ids
                elif isinstance(event, KvBegin):
                    put = puts[event.request_id] = _Put(announced.pop(event.request_id, ()), endpoint, event)
                    self._spawn(self._forward_put(put), f"put {event.request_id}")
                elif isinstance(event, KvChunk):
                    put = puts[event.request_id]
                    # Our own copy (the payload is a view of the receive buffer), through kernel and module.
                    chunk = replace(event, payload=bytes(event.payload))
                    item = ChunkInFlight(chunk=chunk, arrived_ns=self.mb.clock.now_ns(), raw_bytes=event.raw_bytes)
                    put.queue.put_nowait(asyncio.ensure_future(self.mb._run_stages(item, self.mb.kernel)))
                elif isinstance(event, KvEnd):
                    puts.pop(event.request_id).queue.put_nowait(_END)
                elif isinstance(event, Error) and event.request_id in puts:
                    puts.pop(event.request_id).queue.put_nowait(event)
                elif isinstance(event, Bye):
                    break
        finally:
            for put in puts.values():
                put.queue.put_nowait(Error(code=ErrorCode.REQUEST_FAILED, message="prefill went away mid-put",
                                           request_id=put.begin.request_id))

    async def _start_fetch(self, owner: Endpoint, fetch: PoolFetch) -> None:
        try:
            fetch_conn, _ = await self._pool()
            self._fetch_owner[fetch.request_id] = owner
            await fetch_conn.send(fetch)
        except (ConnectionError, ProtocolError) as exc:
            self._fetch_owner.pop(fetch.request_id, None)
            await self._tell(owner, Error(code=ErrorCode.REQUEST_FAILED, message=f"pool down: {exc}"[:1000],
                                          request_id=fetch.request_id), "fetch")

    async def _forward_put(self, put: _Put) -> None:
        rid = put.begin.request_id
        kernel = self.mb.kernel
        begin = put.begin
        if begin.codec == "none" and kernel.codec is not None:
            begin = replace(begin, codec=kernel.name)
        try:
            if not put.hash_ids:
                raise ConfigError(f"KvBegin for request {rid} on the pool path without a PoolPut naming its blocks")
            _, put_conn = await self._pool()
            self._put_owner[rid] = put.owner
            async with self.put_lane.transfer(put_conn, label=f"put {rid}") as link:
                await link.send(PoolPut(request_id=rid, hash_ids=put.hash_ids))
                await link.send(begin)
                while True:
                    entry = await put.queue.get()
                    if entry is _END:
                        await link.send(put_conn.connection.kv_end(rid))
                        return
                    if isinstance(entry, Error):
                        await link.send(entry)
                        self._put_owner.pop(rid, None)
                        self._count("put", "failed")
                        return
                    item = await entry
                    await link.send(item.chunk, min_serialise_s=item.modelled_compute_s)
                    self._account("put", item.raw_bytes, item.wire_bytes, item)
        except (ConnectionError, ProtocolError, ConfigError, KernelInputError) as exc:
            self._put_owner.pop(rid, None)
            await self._tell(put.owner, Ack(request_id=rid, status=AckStatus.FAILED, detail=str(exc)[:200]), "put")
            await self._drain(put)

    @staticmethod
    async def _drain(put: _Put) -> None:
        while True:
            entry = await put.queue.get()
            if entry is _END or isinstance(entry, Error):
                return
            with contextlib.suppress(Exception):
                await entry

    # -- bookkeeping ------------------------------------------------------------------------------------

    async def _tell(self, owner: Endpoint | None, event, failed_phase: str | None) -> None:
        if failed_phase is not None:
            self._count(failed_phase, "failed")
        if owner is None or owner.is_closing:
            return
        with contextlib.suppress(ConnectionError, ProtocolError):
            await owner.send(event)

    def _count(self, phase: str, outcome: str) -> None:
        self.metrics.requests.labels(phase=phase, outcome=outcome).inc()
        if outcome == "ok":
            self.totals["fetches" if phase == "fetch" else "puts"] += 1
        else:
            self.totals["failed"] += 1

    def _account(self, phase: str, raw: int, wire: int, item: ChunkInFlight) -> None:
        m = self.metrics
        model = self.mb.model_bytes_per_byte
        m.bytes.labels(phase=phase, stage="raw").inc(raw * model)
        m.bytes.labels(phase=phase, stage="wire").inc(wire * model)
        self.totals[f"{phase}_raw_bytes"] += raw
        self.totals[f"{phase}_wire_bytes"] += wire
        self.totals["module_energy_j"] += self.mb.module_stage.energy_j(item)
        self.totals["module_ops"] += item.module_ops

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def stats(self) -> dict:
        return {**self.totals, "pool": f"{self.pool_host}:{self.pool_port}",
                "fetch_lane_busy": self.fetch_lane.busy_ratio(), "put_lane_busy": self.put_lane.busy_ratio()}

    async def close(self) -> None:
        for conn in (self._fetch_conn, self._put_conn):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.send(Bye(reason="middlebox stopping")), 1.0)
                conn.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)


class PoolLost(Exception):
    """The connection to the kvpool broke or closed (as opposed to the prefill's side going away)."""


async def _from_pool(conn: Endpoint):
    """The pool connection's next event (None at a clean close); its failures become PoolLost."""
    try:
        return await conn.next_event()
    except (ProtocolError, ConnectionError) as exc:
        raise PoolLost(f"kvpool connection lost: {exc}") from None
