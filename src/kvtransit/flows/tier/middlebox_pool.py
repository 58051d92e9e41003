"""The middlebox's pool path: prefix KV between the prefill and the shared KV pool, over the module and a link.

    prefill ──PoolFetch──▶ middlebox ─────────────────────▶ kvpool
    prefill ◀──PoolHit + blocks (compact)── module ◀══link══ kvpool         (fetch: TTFT pays this)
    prefill ──PoolPut + raw blocks──▶ kernel ══link══▶ kvpool ──Ack──▶ prefill   (write-back, compressed once)

- **Write-back** (put): the prefill sends new blocks raw (read by `flows/tier/pool_stream.py: PutAssembler`,
  as the pool reads them); each chunk runs down the same stage chain as a hand-off (pipeline.KvStream:
  compressed once, on the way out), then over the put lane of the pool link to the pool, which stores the
  compact form. The pool's Ack is relayed to the prefill. As on the hand-off path, each prefill connection may
  run at most the middlebox's in-flight limit ahead of the lane (pipeline.ByteBudget): past it, the middlebox
  stops reading and TCP pushes back to the prefill. A chunk the kernel refuses fails the put: the pool is sent
  an Error naming the request (it drops what it holds), the prefill a FAILED Ack.
- **Fetch**: the pool streams the blocks as stored; they cross the fetch lane of the pool link at their wire
  (compact) size, paced by the link's rate and latency, and the module is charged the inverse transform
  (docs/reference.md §5's pricing, the same `ModuleStage` as the forward direction: its modelled compute holds the
  link when the module is slower than the wire). The prefill accepts the compact form (the KV's content is
  not used by the emulated GPU; its raw size is in every chunk header).
- The pool link is the scenario's link (`--link`), shaped at the same scale and dilation as the hand-off
  link, with one lane per direction (full duplex), each a FIFO (docs/reference.md §4 style).

A pool that cannot be reached or goes away fails the fetches and puts in flight with a reason (an Error
naming the request), so the prefill falls back to recomputing; it is redialled on the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.agents.middlebox.pipeline import RUNS_ON_GPU, Abandoned, ByteBudget, Delivered, KvStream, Refused
from kvtransit.agents.middlebox.stages.kernel import RUNS_ON_MODULE, RUNS_ON_NONE
from kvtransit.flows.tier.metrics import pool_relay_metrics
from kvtransit.flows.tier.pool_accounting import PoolAccounting
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
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.egress import EgressShaper
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Endpoint, open_greeted
from kvtransit.wire import WIRE_VERSION, ErrorCode, clip_message, clip_reason
from kvtransit.wire.errors import ProtocolError
from kvtransit.wire.events import (
    Ack,
    AckStatus,
    Bye,
    Error,
    Hello,
    KvBegin,
    KvChunk,
    KvEnd,
    PoolFetch,
    PoolHit,
    PoolPut,
    Role,
)

log = logging.getLogger(__name__)

POOL_RETRY_S = 1.0  # after a failed dial, the next request waits at least this long before redialling


PoolDial = Callable[[str], Awaitable[Endpoint]]
"""Opens one greeted connection to the pool, given the name to say in Hello (tests dial in memory)."""


@dataclass
class _WriteBack:
    """A write-back on its way to the pool: what its prefill opened, who to answer, its stream of chunks."""

    opened: OpenPut  # its KvBegin and the blocks its PoolPut named
    owner: Endpoint
    stream: KvStream

    @property
    def request_id(self) -> int:
        return self.opened.request_id


class PoolRelay:
    """Owned by a Middlebox; shares its stage chain, has its own two lanes to the pool."""

    def __init__(self, middlebox: Middlebox, pool_host: str, pool_port: int, *, registry,
                 dial: PoolDial | None = None):
        """`dial`: how to reach the pool (default: TCP to pool_host:pool_port, greeted both ways)."""
        self.middlebox = middlebox
        self.clock: Clock = middlebox.clock
        self.pool_host, self.pool_port = pool_host, pool_port
        self._dial: PoolDial = dial if dial is not None else self._dial_tcp
        scenario = middlebox.scenario
        shaped = scenario.scaled_link
        self.accounting = PoolAccounting(pool_relay_metrics(registry), dilation=middlebox.dilation,
                                         model_bytes_per_byte=middlebox.model_bytes_per_byte)
        latency_s = shaped.latency_s + scenario.module.added_latency_s * middlebox.dilation
        self.fetch_lane = EgressShaper(rate_Bps=shaped.bandwidth_Bps, latency_s=latency_s, clock=self.clock,
                                       on_transfer_done=lambda r: self.accounting.lane_done("fetch", r))
        self.put_lane = EgressShaper(rate_Bps=shaped.bandwidth_Bps, latency_s=latency_s, clock=self.clock,
                                     on_transfer_done=lambda r: self.accounting.lane_done("put", r))
        # Two connections to the pool, so a long write-back never holds a fetch behind it on one socket.
        self._fetch_conn: Endpoint | None = None
        self._put_conn: Endpoint | None = None
        self._dial_lock = asyncio.Lock()
        self._last_failed_dial_ns: int | None = None
        self._fetch_owner: dict[int, Endpoint] = {}
        self._put_owner: dict[int, Endpoint] = {}
        self._tasks = TaskSet(f"{middlebox.name} pool relay")

    # -- the pool side ----------------------------------------------------------------------------------

    async def _pool(self) -> tuple[Endpoint, Endpoint]:
        """Both pool connections, dialled if need be (ConnectionError when the pool cannot be reached)."""
        async with self._dial_lock:
            if self._fetch_conn is not None and not self._fetch_conn.is_closing and \
                    self._put_conn is not None and not self._put_conn.is_closing:
                return self._fetch_conn, self._put_conn
            if self._last_failed_dial_ns is not None and \
                    self.clock.now_ns() - self._last_failed_dial_ns < POOL_RETRY_S * 1e9:
                raise ConnectionError(f"kvpool at {self.pool_host}:{self.pool_port} is down (retrying shortly)")
            for conn in (self._fetch_conn, self._put_conn):
                if conn is not None:
                    conn.abort()
            conns: list[Endpoint] = []
            try:
                for lane in ("fetch", "put"):
                    conns.append(await self._dial(f"{self.middlebox.name}-{lane}"))
            except (ConnectionError, OSError, ProtocolError) as exc:
                for conn in conns:
                    conn.abort()
                self._last_failed_dial_ns = self.clock.now_ns()
                raise ConnectionError(f"kvpool at {self.pool_host}:{self.pool_port} unreachable: {exc}") from None
            self._fetch_conn, self._put_conn = conns
            self._tasks.spawn(self._read_fetches(self._fetch_conn), "pool fetch reader")
            self._tasks.spawn(self._read_put_acks(self._put_conn), "pool put reader")
            return self._fetch_conn, self._put_conn

    async def _dial_tcp(self, name: str) -> Endpoint:
        return await open_greeted(self.pool_host, self.pool_port, Role.MIDDLEBOX, Role.KVPOOL, name=name)

    async def _read_fetches(self, conn: Endpoint) -> None:
        """The pool's fetch answers, one at a time, each relayed over the fetch lane to the prefill asking."""
        reason = "kvpool connection closed"
        try:
            while (event := await _from_pool(conn)) is not None:
                match event:
                    case PoolHit():
                        await self._relay_fetch(conn, event)
                    case Error() if event.request_id is not None:
                        await self._tell(self._fetch_owner.pop(event.request_id, None), event, "fetch")
                    case Bye():
                        break
        except PoolLost as exc:
            reason = str(exc)
        finally:
            conn.abort()
            for rid, owner in list(self._fetch_owner.items()):
                await self._tell(owner, Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(reason),
                                              request_id=rid), "fetch")
            self._fetch_owner.clear()

    async def _relay_fetch(self, conn: Endpoint, hit: PoolHit) -> None:
        """One fetch answer: PoolHit, then (blocks > 0) its KV stream, over the fetch lane to the prefill."""
        rid = hit.request_id
        owner = self._fetch_owner.pop(rid, None)
        kernel = self.middlebox.kernel
        module = self.middlebox.chain.module
        streaming = hit.blocks > 0  # the pool's KV stream for this fetch is still to be read
        # Every frame is paced from the answer's arrival (as the hand-off is from its first token): the time
        # this host spends reading the pool's frames is not charged on top of the link's.
        start_ns = self.clock.now_ns()
        try:
            if owner is None or owner.is_closing:
                raise ConnectionError(f"the prefill that asked for fetch {rid} is gone")
            async with self.fetch_lane.transfer(owner, label=f"fetch {rid}") as link:
                await link.send(hit, ready_ns=start_ns)
                while streaming:
                    match await _from_pool(conn):
                        case None:
                            raise PoolLost("kvpool closed mid-fetch")
                        case KvBegin() as begin:
                            await link.send(begin, ready_ns=start_ns)
                        case KvChunk() as chunk:
                            # A block stored compact by this module is decoded here; one the prefill's GPU
                            # compressed (--compress-at gpu: no kernel here) is decoded by that GPU.
                            runs_on = RUNS_ON_NONE if not chunk.codec_id else \
                                RUNS_ON_MODULE if kernel.codec is not None else RUNS_ON_GPU
                            item = ChunkInFlight(chunk=chunk, raw_bytes=chunk.raw_bytes,
                                                 codec=kernel.name if chunk.codec_id else "none", runs_on=runs_on)
                            # Decompressing on the way in costs the module what compressing did (the inverse
                            # transform, docs/reference.md §5 pricing); a module slower than the wire holds the link.
                            item = module.price(item, kernel)
                            await link.send(chunk, ready_ns=start_ns, min_serialise_s=item.modelled_compute_s)
                            self.accounting.chunk("fetch", item, raw=chunk.raw_bytes, wire=len(chunk.payload),
                                                  module_j=module.energy_j(item))
                        case KvEnd():
                            streaming = False
                            await link.send(owner.connection.kv_end(rid), ready_ns=start_ns)
                        case Error() as error:
                            streaming = False
                            await link.send(error)
                            self.accounting.outcome("fetch", ok=False)
                            return
            self.accounting.outcome("fetch", ok=True)
        except (ConnectionError, ProtocolError) as exc:  # the prefill's side; the pool's is PoolLost
            log.info("fetch %d not delivered: %s", rid, exc)
            self.accounting.outcome("fetch", ok=False)
            while streaming:  # read the rest of the answer off the pool connection, and drop it
                event = await _from_pool(conn)
                if event is None:
                    raise PoolLost("kvpool closed mid-fetch") from None
                streaming = not isinstance(event, (KvEnd, Error))

    async def _read_put_acks(self, conn: Endpoint) -> None:
        reason = "kvpool connection closed"
        try:
            while (event := await _from_pool(conn)) is not None:
                match event:
                    case Ack():
                        self.accounting.outcome("put", ok=event.status == AckStatus.OK)
                        await self._tell(self._put_owner.pop(event.request_id, None), event, None)
                    case Error() if event.request_id is not None:
                        await self._tell(self._put_owner.pop(event.request_id, None), event, "put")
                    case Bye():
                        break
        except PoolLost as exc:
            reason = str(exc)
        finally:
            conn.abort()
            for rid, owner in list(self._put_owner.items()):
                await self._tell(owner, Ack(request_id=rid, status=AckStatus.FAILED, detail=clip_reason(reason)),
                                 "put")
            self._put_owner.clear()

    # -- the prefill side -------------------------------------------------------------------------------

    async def handle_prefill(self, endpoint: Endpoint) -> None:
        """One prefill's pool connection: fetches and write-backs in, answers out."""
        await endpoint.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name=self.middlebox.name))
        # The connection's write-backs share one budget, the middlebox's in-flight limit, as a hand-off
        # connection's do: a slow put lane stops this reader instead of piling chunks up here.
        budget = ByteBudget(self.middlebox.inflight_bytes)
        assembler = PutAssembler()
        write_backs: dict[int, _WriteBack] = {}
        try:
            async for event in endpoint:
                match event:
                    case PoolFetch():
                        await self._start_fetch(endpoint, event)
                    case Bye():
                        break
                    case _:
                        await self._put_step(endpoint, write_backs, budget, assembler.receive(event))
        finally:
            for put in assembler.close():
                write_backs.pop(put.request_id).stream.abort("prefill went away mid-put")

    async def _put_step(self, endpoint: Endpoint, write_backs: dict[int, _WriteBack], budget: ByteBudget,
                        step: PutStep | None) -> None:
        match step:
            case PutOpened(put):
                stream = KvStream(put.request_id, self.middlebox.chain, self.middlebox.kernel, budget)
                write_back = write_backs[put.request_id] = _WriteBack(put, endpoint, stream)
                self._tasks.spawn(self._forward_put(write_back), f"put {put.request_id}")
            case PutChunk(put, chunk):
                await write_backs[put.request_id].stream.ingest(chunk, source_codec=put.begin.codec)
            case PutEnded(put):
                write_backs.pop(put.request_id).stream.end()
            case PutAborted(put, error):
                write_backs.pop(put.request_id).stream.abort(error.message, error.code)
            case PutWithdrawn():
                pass  # given up before its KvBegin: nothing was sent on to the pool for it yet

    async def _start_fetch(self, owner: Endpoint, fetch: PoolFetch) -> None:
        try:
            fetch_conn, _ = await self._pool()
            self._fetch_owner[fetch.request_id] = owner
            await fetch_conn.send(fetch)
        except (ConnectionError, ProtocolError) as exc:
            self._fetch_owner.pop(fetch.request_id, None)
            await self._tell(owner, Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(f"pool down: {exc}"),
                                          request_id=fetch.request_id), "fetch")

    async def _forward_put(self, write_back: _WriteBack) -> None:
        rid = write_back.request_id
        stream = write_back.stream
        hash_ids = write_back.opened.hash_ids
        try:
            if not hash_ids:
                await self._refuse_put(write_back, f"KvBegin for request {rid} on the pool path without a PoolPut "
                                                   "naming its blocks")
                return
            _, put_conn = await self._pool()
            self._put_owner[rid] = write_back.owner
            async with self.put_lane.transfer(put_conn, label=f"put {rid}") as link:
                await link.send(PoolPut(request_id=rid, hash_ids=hash_ids))
                await link.send(stream.next_hop_begin(write_back.opened.begin))
                outcome = await stream.deliver(link, kv_end=put_conn.connection.kv_end, on_sent=self._on_put_sent)
            match outcome:
                case Delivered():
                    pass  # the pool's Ack (or Error) answers the prefill
                case Abandoned():  # the prefill gave up on it: nobody to answer
                    self._put_owner.pop(rid, None)
                    self.accounting.outcome("put", ok=False)
                case Refused(reason):  # the pool was sent an Error naming the put: it drops what it holds
                    await self._refuse_put(write_back, reason)
        except (ConnectionError, ProtocolError) as exc:
            await self._refuse_put(write_back, str(exc))
        finally:
            await stream.discard()

    async def _refuse_put(self, write_back: _WriteBack, reason: str) -> None:
        """The put will not be stored: a FAILED Ack tells the prefill (a write-back is never retried)."""
        rid = write_back.request_id
        self._put_owner.pop(rid, None)
        await self._tell(write_back.owner, Ack(request_id=rid, status=AckStatus.FAILED, detail=clip_reason(reason)),
                         "put")

    def _on_put_sent(self, item: ChunkInFlight) -> None:
        self.accounting.chunk("put", item, raw=item.raw_bytes, wire=item.wire_bytes,
                              module_j=self.middlebox.chain.module.energy_j(item))

    # -- bookkeeping ------------------------------------------------------------------------------------

    async def _tell(self, owner: Endpoint | None, event, failed_phase: str | None) -> None:
        if failed_phase is not None:
            self.accounting.outcome(failed_phase, ok=False)
        if owner is None or owner.is_closing:
            return
        with contextlib.suppress(ConnectionError, ProtocolError):
            await owner.send(event)

    def stats(self) -> dict:
        return {**self.accounting.stats(), "pool": f"{self.pool_host}:{self.pool_port}",
                "fetch_lane_busy": self.fetch_lane.busy_ratio(), "put_lane_busy": self.put_lane.busy_ratio()}

    async def close(self) -> None:
        for conn in (self._fetch_conn, self._put_conn):
            if conn is not None:
                await conn.goodbye("middlebox stopping")
                conn.abort()
        await self._tasks.close()


class PoolLost(Exception):
    """The connection to the kvpool broke or closed (as opposed to the prefill's side going away)."""


async def _from_pool(conn: Endpoint):
    """The pool connection's next event (None at a clean close); its failures become PoolLost."""
    try:
        return await conn.next_event()
    except (ProtocolError, ConnectionError) as exc:
        raise PoolLost(f"kvpool connection lost: {exc}") from None
