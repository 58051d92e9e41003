"""The middlebox process: the compute-in-transit module on the prefill → decode link (DESIGN §1).

It terminates each prefill's KV stream, runs every chunk down the stage chain (kernel → module → link),
and forwards the (smaller) frames over the shaped link to a decode instance. Decode's acks come back
through it to the prefill that owns the request, so the prefill can release its KV.

Every accepted hand-off ends with an outcome (counted in `kvtransit_middlebox_requests_total`):
ok (decode acked), failed (with a reason the prefill is told), never silently lost. A failure the prefill
may retry (the link or decode failed behind us) is an Error naming the request; a final one (decode or the
kernel refused the KV) is a FAILED Ack. A peer that breaks the protocol loses its own connection only.

Recovery. Hand-offs are idempotent by request id: a KvBegin for a request still open from another (dead)
prefill connection supersedes it. A decode connection that drops is dialled again, for as long as we run,
so a restarted decode is picked up. Faults (faults/, the control API's /faults) sit in the write path to
each decode instance.

Ordering and memory. Each prefill connection sends one request's KV at a time (the prefill agent does),
and may run at most `inflight_bytes` ahead of the link: past that, the middlebox stops reading from it and
TCP pushes back to the prefill. Hand-offs wait for a link channel in the order their KvBegin arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry

from kvtransit.kernels import KernelInputError
from kvtransit.model.errors import ConfigError
from kvtransit.model.module import Policy
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.runtime.egress import EgressShaper, TransferRecord
from kvtransit.runtime.metrics import middlebox_metrics
from kvtransit.runtime.transport import Endpoint, open_endpoint
from kvtransit.shaping.commands import burst_bytes as tc_burst_bytes
from kvtransit.shaping.commands import wire_rate_Bps as tc_wire_rate_Bps
from kvtransit.shaping.spec import SHAPED_MTU  # the shaped veth's MTU: its header overhead enters the hold
from kvtransit.wire import WIRE_VERSION, ErrorCode
from kvtransit.wire.errors import ProtocolError
from kvtransit.wire.events import (Ack, AckStatus, Bye, Error, Hello, KvBegin, KvChunk, KvEnd, Role)

from .faults import FaultChain, FaultedEndpoint
from .items import ChunkInFlight
from .stages import KernelConfig, KernelStage, LinkStage, ModuleStage
from .stages.kernel import ActiveKernel, activate

log = logging.getLogger(__name__)

# How far one prefill connection may run ahead of the link: 32 MiB is ~170 ms of a scaled eth-25g link
# (195 MB/s), enough that the link never idles waiting for the kernel, small enough to bound memory.
DEFAULT_INFLIGHT_BYTES = 32 * 1024 * 1024
# With the link's rate shaped by the kernel (tc on the egress veth), the user-space token bucket stays in
# the chain only to hold a transit-bound module's extra time: it runs this many times faster than the link,
# so it never binds on the bytes themselves (TCP back-pressure from tc's queue paces the writes).
TC_BYPASS_FACTOR = 8.0
LINK_BACKENDS = ("userspace", "tc")

# Decode may start after us (compose) or restart: keep trying to connect for this long at start-up.
DEFAULT_CONNECT_TIMEOUT_S = 30.0
CONNECT_RETRY_S = 0.2

OUTCOME_OK = "ok"
OUTCOME_FAILED = "failed"


class ByteBudget:
    """Bytes one connection may hold in the middlebox; acquire waits while over the limit.

    One acquirer (the connection's reader) at a time; a single chunk larger than the limit is let through
    alone, so a big chunk can never wedge the connection."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._waiter: asyncio.Future[None] | None = None

    async def acquire(self, nbytes: int) -> None:
        while self.used and self.used + nbytes > self.limit:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        self.used += nbytes

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


@dataclass(frozen=True)
class _End:
    """Queue marker: the prefill's KvEnd arrived (the stream is complete)."""


@dataclass(frozen=True)
class _Abort:
    """Queue marker: the hand-off cannot complete (its prefill went away)."""

    reason: str


END = _End()


@dataclass
class Handoff:
    """One request's KV on its way through the middlebox."""

    begin: KvBegin
    source: Endpoint
    kernel: ActiveKernel  # snapshot at KvBegin: a live kernel change applies to later hand-offs
    budget: ByteBudget
    arrived_ns: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    failed: str | None = None
    done: bool = False

    @property
    def request_id(self) -> int:
        return self.begin.request_id


@dataclass
class DecodePeer:
    name: str
    host: str
    port: int
    endpoint: Endpoint | None = None
    unacked: dict[int, Handoff] = field(default_factory=dict)
    reader: asyncio.Task | None = None

    @property
    def connected(self) -> bool:
        return self.endpoint is not None and not self.endpoint.is_closing


class Middlebox:
    def __init__(self, scenario: Scenario, decode_addresses: list[tuple[str, int]], *,
                 registry: CollectorRegistry | None = None, clock: Clock | None = None, name: str = "middlebox-0",
                 inflight_bytes: int = DEFAULT_INFLIGHT_BYTES, kernel_threads: int = 1,
                 link_backend: str = "userspace"):
        """`link_backend`: "userspace" (the token bucket shapes the rate) or "tc" (the kernel's qdisc on our
        egress does, and this process keeps only the delay line and the module's hold)."""
        if link_backend not in LINK_BACKENDS:
            raise ConfigError(f"unknown link backend {link_backend!r} (choose from: {', '.join(LINK_BACKENDS)})")
        self.link_backend = link_backend
        self.scenario = scenario
        self.name = name
        self.clock = clock if clock is not None else MonotonicClock()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = middlebox_metrics(self.registry)
        self.inflight_bytes = inflight_bytes
        self.link_name = scenario.link
        self.dilation = scenario.effective_dilation
        # Bytes at payload scale → modelled bytes (energy and ops are reported for the modelled KV).
        self.model_bytes_per_byte = 1.0 / scenario.effective_scale
        self.policy = Policy(scenario.policy)

        shaped = scenario.scaled_link
        kernel = activate(self._initial_kernel_config(), scenario.module, self.policy)
        module_latency_s = scenario.module.added_latency_s * self.dilation
        bucket_Bps = shaped.bandwidth_Bps * (TC_BYPASS_FACTOR if link_backend == "tc" else 1.0)
        # tc's tbf starts each hand-off after an idle gap with a full bucket, and lets that burst through at
        # once: hold each hand-off back by the burst's own time, so it ends when latency + bytes / rate says.
        self._tc_burst_hold_ns = (round(tc_burst_bytes(tc_wire_rate_Bps(shaped.bandwidth_Bps, SHAPED_MTU))
                                        / tc_wire_rate_Bps(shaped.bandwidth_Bps, SHAPED_MTU) * 1e9)
                                  if link_backend == "tc" else 0)
        shaper = EgressShaper(rate_Bps=bucket_Bps, latency_s=shaped.latency_s + module_latency_s,
                              channels=scenario.channels, clock=self.clock, on_transfer_done=self._on_transfer_done)
        self.kernel_stage = KernelStage(kernel, threads=kernel_threads)
        self.module_stage = ModuleStage(scenario.module, link_rate_Bps=shaped.bandwidth_Bps,
                                        model_bytes_per_byte=self.model_bytes_per_byte)
        self.link_stage = LinkStage(shaped, shaper, module_latency_s=module_latency_s,
                                    model_link=scenario.link_spec, dilation=self.dilation)
        self.decodes = [DecodePeer(f"decode-{i}", host, port) for i, (host, port) in enumerate(decode_addresses)]
        self._owners: dict[int, Endpoint] = {}  # request id → the prefill connection to ack
        self.faults = FaultChain()
        self._closing = False
        self._open: dict[int, Handoff] = {}
        self._tasks: set[asyncio.Task] = set()
        self.totals = {"kv_in_bytes": 0, "wire_bytes": 0, "frames_in": 0, "frames_out": 0, "handoffs_ok": 0,
                       "handoffs_failed": 0, "kernel_compute_s": 0.0, "modelled_compute_s": 0.0,
                       "module_energy_j": 0.0, "link_energy_j": 0.0, "module_ops": 0.0, "transit_bound_frames": 0}
        self.failed_reasons: dict[str, int] = {}
        self._set_link_gauges()
        self._declare_series(kernel.name)

    def _declare_series(self, codec: str) -> None:
        """Create the labelled series at zero, so a query (and a dashboard panel) sees 0, not "no data"."""
        m, link = self.metrics, self.link_name
        for series in (m.kv_wire_bytes, m.module_ops, m.modelled_compute_seconds, m.transit_bound):
            series.labels(link=link, codec=codec)
        for stage in ("ingress", "egress"):
            m.frames.labels(link=link, stage=stage)
        for stage in ("link", "module"):
            m.module_energy_joules.labels(link=link, stage=stage)
        for outcome in (OUTCOME_OK, OUTCOME_FAILED):
            m.requests.labels(outcome=outcome)

    def _initial_kernel_config(self) -> KernelConfig:
        s = self.scenario
        # --compress-at gpu: the prefill already ran the codec; the module passes its bytes through.
        codec = "none" if s.compress_at == "gpu" else s.codec
        return KernelConfig(codec=codec, keep=s.keep, block=s.block, sinks=s.sinks, variant=s.variant)

    # -- the chain, live ----------------------------------------------------------------------------------

    @property
    def kernel(self) -> ActiveKernel:
        return self.kernel_stage.kernel

    def describe_chain(self) -> list[dict]:
        return [self.kernel_stage.describe(), self.module_stage.describe(), self.link_stage.describe()]

    def set_kernel(self, config: KernelConfig) -> ActiveKernel:
        """Swap the kernel for hand-offs that start from now on (ConfigError/KernelInputError if refused)."""
        self.kernel_stage.kernel = activate(config, self.scenario.module, self.policy)
        self._declare_series(config.codec)
        return self.kernel_stage.kernel

    def set_link(self, *, rate_Bps: float | None = None, latency_s: float | None = None,
                 jitter_s: float | None = None) -> None:
        if rate_Bps is not None:
            if self.link_backend == "tc":
                raise ConfigError("the link's rate is shaped by tc here (--link-backend tc): change it with "
                                  "shaping/ (kvtransit links), not through the middlebox")
            self.link_stage.set_rate(rate_Bps)
        if latency_s is not None or jitter_s is not None:
            current = self.link_stage.shaper.latency_s - self.link_stage.module_latency_s
            self.link_stage.set_latency(current if latency_s is None else latency_s, jitter_s)
        self._set_link_gauges()

    @property
    def shaped_rate_Bps(self) -> float:
        """The rate the link is shaped to (by our bucket, or by tc)."""
        rate = self.link_stage.shaper.rate_Bps
        return rate / TC_BYPASS_FACTOR if self.link_backend == "tc" else rate

    def _set_link_gauges(self) -> None:
        m, link = self.metrics, self.link_name
        shaper = self.link_stage.shaper
        # Configured figures in model units: the shaped rate × dilation ÷ scale is the modelled link's rate.
        m.link_configured_rate.labels(link=link).set(self.shaped_rate_Bps * self.dilation * self.model_bytes_per_byte)
        m.link_configured_latency.labels(link=link).set(
            (shaper.latency_s - self.link_stage.module_latency_s) / self.dilation)
        m.link_busy_ratio.labels(link=link).set_function(shaper.busy_ratio)
        if self.link_backend == "userspace":
            # With tc, what leaves our socket is not what crossed the link: decode measures that instead.
            m.link_achieved_rate.labels(link=link).set_function(
                lambda: shaper.achieved_rate_Bps * self.dilation * self.model_bytes_per_byte)

    # -- decode side --------------------------------------------------------------------------------------

    async def connect_decodes(self, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        """Connect to every decode instance, retrying while they start; a clear error after `timeout_s`."""
        await asyncio.gather(*(self._connect(peer, timeout_s) for peer in self.decodes))

    async def _connect(self, peer: DecodePeer, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                endpoint = await open_endpoint(peer.host, peer.port, Role.MIDDLEBOX, Role.DECODE)
                break
            except OSError as exc:
                if loop.time() >= deadline:
                    raise ConfigError(f"cannot reach {peer.name} at {peer.host}:{peer.port} (--decode) after "
                                      f"{timeout_s:.0f} s: {exc}") from None
                await asyncio.sleep(CONNECT_RETRY_S)
        endpoint = FaultedEndpoint(endpoint, self.faults)
        await endpoint.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name=self.name))
        peer.endpoint = endpoint
        peer.reader = self._spawn(self._read_decode(peer), f"read {peer.name}")

    async def _redial(self, peer: DecodePeer) -> None:
        """A decode connection dropped (decode restarted, the link reset): dial it again while we run."""
        while not self._closing:
            try:
                await self._connect(peer, timeout_s=DEFAULT_CONNECT_TIMEOUT_S)
                log.warning("%s is connected again", peer.name)
                return
            except (ConfigError, ConnectionError, OSError, ProtocolError) as exc:
                log.info("%s not reachable yet: %s", peer.name, exc)
                await asyncio.sleep(CONNECT_RETRY_S)

    async def _read_decode(self, peer: DecodePeer) -> None:
        endpoint = peer.endpoint
        assert endpoint is not None
        reason = f"{peer.name} closed the connection"
        try:
            async for event in endpoint:
                if isinstance(event, Ack):
                    handoff = peer.unacked.pop(event.request_id, None)
                    await self._relay_ack(event, handoff)
                elif isinstance(event, Error):
                    log.warning("%s reports: %s (request %s)", peer.name, event.message, event.request_id)
                    if event.request_id is not None and event.request_id in peer.unacked:
                        handoff = peer.unacked.pop(event.request_id)
                        await self._fail(handoff, f"{peer.name}: {event.message}", retryable=True)
                elif isinstance(event, Bye):
                    break
        except (ProtocolError, ConnectionError) as exc:
            reason = f"{peer.name} connection lost: {exc}"
            log.warning(reason)
        finally:
            endpoint.abort()
            # Everything sent there and not yet acked is lost with the connection: say so, per request (its
            # prefill still holds the KV and sends it again).
            for handoff in list(peer.unacked.values()):
                await self._fail(handoff, reason, retryable=True)
            peer.unacked.clear()
            if not self._closing:
                self._spawn(self._redial(peer), f"redial {peer.name}")

    def _pick_decode(self) -> DecodePeer | None:
        """The connected decode instance with the fewest hand-offs not yet acked (REFERENCE §4's router sees
        queue + running; the middlebox sees what it has sent and decode has not yet taken)."""
        live = [p for p in self.decodes if p.connected]
        return min(live, key=lambda p: len(p.unacked)) if live else None

    # -- prefill side -------------------------------------------------------------------------------------

    async def handle_prefill(self, endpoint: Endpoint) -> None:
        """One prefill connection: its KV streams in, acks out."""
        await endpoint.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name=self.name))
        budget = ByteBudget(self.inflight_bytes)
        mine: dict[int, Handoff] = {}
        lost = "prefill closed the connection mid-request"
        try:
            async for event in endpoint:
                if isinstance(event, KvChunk):
                    await self._ingest_chunk(mine.get(event.request_id), event)
                elif isinstance(event, KvBegin):
                    mine[event.request_id] = self._begin(event, endpoint, budget)
                elif isinstance(event, KvEnd):
                    handoff = mine.pop(event.request_id)
                    handoff.queue.put_nowait(END)
                elif isinstance(event, Error) and event.request_id in mine:
                    mine.pop(event.request_id).queue.put_nowait(_Abort(f"prefill gave up: {event.message}"))
                elif isinstance(event, Bye):
                    break
        except (ProtocolError, ConnectionError) as exc:
            lost = f"prefill connection lost mid-request: {exc}"
            raise
        finally:
            for handoff in mine.values():
                handoff.queue.put_nowait(_Abort(lost))

    def _begin(self, begin: KvBegin, source: Endpoint, budget: ByteBudget) -> Handoff:
        kernel = self.kernel
        stale = self._open.get(begin.request_id)
        if stale is not None and stale.source is not source:
            # A retry from a reconnected prefill: the old attempt's connection is gone (or going). End it, so
            # decode drops its partial stream, and carry the new one. Idempotent by request id.
            stale.queue.put_nowait(_Abort("superseded by a retry of the same request"))
        handoff = Handoff(begin=begin, source=source, kernel=kernel, budget=budget, arrived_ns=self.clock.now_ns())
        self._owners[begin.request_id] = source
        self._open[begin.request_id] = handoff
        self._spawn(self._forward(handoff), f"forward request {begin.request_id}")
        return handoff

    async def _ingest_chunk(self, handoff: Handoff | None, event: KvChunk) -> None:
        assert handoff is not None  # the wire guarantees KvBegin came first on this connection
        arrived_ns = self.clock.now_ns()
        nbytes = len(event.payload)
        codec = handoff.begin.codec
        self.metrics.kv_in_bytes.labels(link=self.link_name, codec=codec).inc(event.raw_bytes)
        self.metrics.frames.labels(link=self.link_name, stage="ingress").inc()
        self.totals["kv_in_bytes"] += event.raw_bytes
        self.totals["frames_in"] += 1
        if handoff.failed:
            return  # the hand-off already failed: drain the rest of its stream without keeping it
        await handoff.budget.acquire(nbytes)
        # The payload is a view into the receive buffer, valid until the next read: take our own copy, then
        # let the view go at once, so the connection reuses its buffer instead of allocating a new one.
        chunk = replace(event, payload=bytes(event.payload))
        if isinstance(event.payload, memoryview):
            event.payload.release()
        item = ChunkInFlight(chunk=chunk, arrived_ns=arrived_ns, raw_bytes=event.raw_bytes,
                             codec=codec if event.codec_id else "none",
                             placement="gpu" if event.codec_id else "none")
        future = asyncio.ensure_future(self._run_stages(item, handoff.kernel))
        handoff.queue.put_nowait((future, nbytes))

    async def _run_stages(self, item: ChunkInFlight, kernel: ActiveKernel) -> ChunkInFlight:
        item = await self.kernel_stage.process(item, kernel)
        return self.module_stage.process(item, kernel)

    # -- onto the link ------------------------------------------------------------------------------------

    async def _forward(self, handoff: Handoff) -> None:
        rid = handoff.request_id
        peer = self._pick_decode()
        try:
            if peer is None:
                raise ConnectionError("no decode instance is connected")
            peer.unacked[rid] = handoff
            refused = await self._transfer(handoff, peer)
            if refused is not None:
                await self._fail(handoff, refused)
        except (ConnectionError, ProtocolError) as exc:
            await self._fail(handoff, f"link to {peer.name if peer else 'decode'} failed: {exc}", retryable=True)
        except Exception as exc:  # a bug must still end the request with a reason, and be seen
            log.exception("forwarding request %d failed", rid)
            await self._fail(handoff, f"middlebox error: {type(exc).__name__}: {exc}")
        finally:
            if self._open.get(rid) is handoff:
                del self._open[rid]
            await self._drain(handoff)

    async def _transfer(self, handoff: Handoff, peer: DecodePeer) -> str | None:
        """Carry one hand-off over the link. Returns None when its KvEnd went out, or the reason it was
        abandoned (decode has then been told with an Error naming the request). The transfer always ends
        cleanly, so what was queued on the link (that Error included) is written before the channel frees."""
        rid = handoff.request_id
        endpoint = peer.endpoint
        assert endpoint is not None
        begin = handoff.begin
        if begin.codec == "none" and handoff.kernel.codec is not None:
            begin = replace(begin, codec=handoff.kernel.name)
        # The hand-off starts, in model time, when the prefill produces the first token (REFERENCE §4:
        # hand-off = KV ready - first token). The prefill sends the KV during its step, stamped with the
        # step's end, so frames are held until then and paced from then (the link's FIFO permitting): the
        # host's own overhead of producing and framing the bytes is not charged on top of the link's time,
        # and a host too slow to keep up still shows, as bytes that arrive after they were due.
        start_ns = begin.first_token_ns if begin.first_token_ns > 0 else handoff.arrived_ns
        start_ns += self._tc_burst_hold_ns
        async with self.link_stage.shaper.transfer(endpoint, label=f"request {rid}") as link:
            await link.send(begin, ready_ns=start_ns)
            while True:
                entry = await handoff.queue.get()
                if entry is END:
                    await link.send(endpoint.connection.kv_end(rid))
                    handoff.done = True
                    return None
                if isinstance(entry, _Abort):
                    await link.send(Error(code=ErrorCode.REQUEST_FAILED, message=entry.reason[:1000], request_id=rid))
                    handoff.done = True  # its stream has ended: nothing more will be queued
                    return entry.reason
                future, nbytes = entry
                try:
                    item = await future
                except (KernelInputError, ConfigError) as exc:
                    handoff.budget.release(nbytes)
                    reason = f"kernel {handoff.kernel.name} refused request {rid}: {exc}"
                    await link.send(Error(code=ErrorCode.REQUEST_FAILED, message=reason[:1000], request_id=rid))
                    return reason
                await link.send(item.chunk, ready_ns=start_ns, min_serialise_s=item.modelled_compute_s)
                handoff.budget.release(nbytes)
                self._account_chunk(item)

    async def _drain(self, handoff: Handoff) -> None:
        """Release whatever the hand-off still holds (after a failure, its stream may still be arriving)."""
        if handoff.done:
            return
        while True:
            entry = await handoff.queue.get()
            if entry is END or isinstance(entry, _Abort):
                return
            future, nbytes = entry
            with contextlib.suppress(Exception):
                await future
            handoff.budget.release(nbytes)

    def _account_chunk(self, item: ChunkInFlight) -> None:
        m, link, codec = self.metrics, self.link_name, item.codec
        wire = item.wire_bytes
        m.kv_wire_bytes.labels(link=link, codec=codec).inc(wire)
        m.frames.labels(link=link, stage="egress").inc()
        link_j = self.link_stage.energy_j(wire, self.model_bytes_per_byte)
        module_j = self.module_stage.energy_j(item)
        m.module_energy_joules.labels(link=link, stage="link").inc(link_j)
        m.module_energy_joules.labels(link=link, stage="module").inc(module_j)
        if item.placement in ("module", "host"):
            m.kernel_compute_seconds.labels(link=link, codec=codec).observe(item.kernel_compute_s)
        if item.placement == "module":
            m.module_ops.labels(link=link, codec=codec).inc(item.module_ops)
            m.modelled_compute_seconds.labels(link=link, codec=codec).inc(item.modelled_compute_s / self.dilation)
            if item.transit_bound:
                m.transit_bound.labels(link=link, codec=codec).inc()
        t = self.totals
        t["wire_bytes"] += wire
        t["frames_out"] += 1
        t["link_energy_j"] += link_j
        t["module_energy_j"] += module_j
        t["module_ops"] += item.module_ops
        t["kernel_compute_s"] += item.kernel_compute_s
        t["modelled_compute_s"] += item.modelled_compute_s  # wall seconds, like kernel_compute_s beside it
        t["transit_bound_frames"] += int(item.transit_bound)

    def _on_transfer_done(self, record: TransferRecord) -> None:
        h = self.metrics.handoff_seconds
        # Model seconds (÷ dilation), like every figure kvtransit reports.
        h.labels(link=self.link_name, phase="queue").observe(record.queue_s / self.dilation)
        h.labels(link=self.link_name, phase="transfer").observe(record.transfer_s / self.dilation)
        h.labels(link=self.link_name, phase="total").observe((record.queue_s + record.transfer_s) / self.dilation)

    # -- outcomes -----------------------------------------------------------------------------------------

    async def _relay_ack(self, ack: Ack, handoff: Handoff | None) -> None:
        ok = ack.status == AckStatus.OK
        self._count(OUTCOME_OK if ok else OUTCOME_FAILED, None if ok else f"decode: {ack.detail or 'refused'}")
        owner = self._owners.pop(ack.request_id, None)
        if handoff is not None:
            owner = handoff.source
        if owner is None or owner.is_closing:
            log.info("ack for request %d: its prefill is gone", ack.request_id)
            return
        with contextlib.suppress(ConnectionError, ProtocolError):
            await owner.send(ack)

    async def _fail(self, handoff: Handoff, reason: str, *, retryable: bool = False) -> None:
        """End a hand-off as failed: count it, tell its prefill. Once only. `retryable`: the link or decode
        failed, not the request: an Error naming the request says "send it again" (the prefill decides, by
        its deadline); otherwise a FAILED Ack says it is over."""
        if handoff.failed:
            return
        handoff.failed = reason
        log.warning("request %d failed%s: %s", handoff.request_id, " (retryable)" if retryable else "", reason)
        for peer in self.decodes:
            if peer.unacked.get(handoff.request_id) is handoff:
                del peer.unacked[handoff.request_id]
        self._count(OUTCOME_FAILED, reason)
        if self._owners.get(handoff.request_id) is handoff.source:
            del self._owners[handoff.request_id]
        owner = handoff.source
        if owner is not None and not owner.is_closing:
            message = (Error(code=ErrorCode.REQUEST_FAILED, message=reason[:1000], request_id=handoff.request_id)
                       if retryable else
                       Ack(request_id=handoff.request_id, status=AckStatus.FAILED, t_ns=self.clock.now_ns(),
                           detail=reason[:200]))
            with contextlib.suppress(ConnectionError, ProtocolError):
                await owner.send(message)

    def _count(self, outcome: str, reason: str | None) -> None:
        self.metrics.requests.labels(outcome=outcome).inc()
        self.totals["handoffs_ok" if outcome == OUTCOME_OK else "handoffs_failed"] += 1
        if reason:
            key = reason.split(":")[0][:80]
            self.failed_reasons[key] = self.failed_reasons.get(key, 0) + 1

    # -- housekeeping -------------------------------------------------------------------------------------

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def stats(self) -> dict:
        shaper = self.link_stage.shaper
        return {
            "role": "middlebox", "name": self.name, **self.totals,
            "failed_reasons": dict(self.failed_reasons),
            "open_handoffs": len(self._open),
            "link": {
                "name": self.link_name,
                "configured_Bps": self.shaped_rate_Bps * self.dilation * self.model_bytes_per_byte,
                "shaped_configured_Bps": self.shaped_rate_Bps,
                "busy": shaper.busy_ratio(),
                "transfers": shaper.transfers_done,
                "backend": self.link_backend,
                # Only our own shaper's pacing is the link's rate; with tc, decode's receive side says it.
                **({"achieved_Bps": shaper.achieved_rate_Bps * self.dilation * self.model_bytes_per_byte,
                    "shaped_achieved_Bps": shaper.achieved_rate_Bps} if self.link_backend == "userspace" else {}),
            },
            "chain": self.describe_chain(),
            "faults": self.faults.describe(),
        }

    async def close(self) -> None:
        self._closing = True
        self.faults.clear()
        for peer in self.decodes:
            if peer.connected:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(peer.endpoint.send(Bye(reason="middlebox stopping")), 1.0)
                peer.endpoint.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        self.kernel_stage.close()

