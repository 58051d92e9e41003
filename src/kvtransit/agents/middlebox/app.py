"""The middlebox: the compute-in-transit module on the prefill → decode link (ARCHITECTURE.md, the testbed).

It terminates each prefill's KV stream, runs every chunk down the stage chain (kernel → module → link,
stages/), and forwards the (smaller) frames over the shaped link to a decode instance (decode_peers.py).
Decode's acks come back through it to the prefill that owns the request, so the prefill can release its KV.

Every accepted hand-off ends with an outcome (counted in `kvtransit_middlebox_requests_total`,
accounting.py): ok (decode acked), failed (with a reason the prefill is told), never silently lost. A failure
the prefill may retry (the link or decode failed behind us) is an Error naming the request; a final one
(decode or the kernel refused the KV) is a FAILED Ack. A peer that breaks the protocol loses its own
connection only.

Recovery. Hand-offs are idempotent by request id: a KvBegin for a request still open from another (dead)
prefill connection supersedes it. A decode connection that drops is dialled again (decode_peers.py).

Layer-wise streaming and chunked prefill. A chunk that carries its release time (its layer's compute
ended then) is held until that time and paced from it (pipeline.py), so each layer crosses as the prefill makes it.
Should the prefill's connection go before every such chunk of a stream was released, the prefill failed mid-step:
the layers it had not computed never existed, so the stream is aborted even if its KvEnd had come (decode drops
what it had and reserves nothing).

Ordering and memory. Each prefill connection sends one request's KV at a time (the prefill agent does),
and may run at most `inflight_bytes` ahead of the link: past that, the middlebox stops reading from it and
TCP pushes back to the prefill (pipeline.ByteBudget). Hand-offs wait for a link channel in the order their
KvBegin arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CollectorRegistry

from kvtransit.agents.middlebox.accounting import HandoffAccounting
from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.agents.middlebox.decode_peers import DEFAULT_CONNECT_TIMEOUT_S, DecodePeer, DecodePeers
from kvtransit.agents.middlebox.faults import FaultChain
from kvtransit.agents.middlebox.handoff import Handoff
from kvtransit.agents.middlebox.pipeline import Abandoned, ByteBudget, Delivered, KvStream, Refused
from kvtransit.agents.middlebox.stages import DEFAULT_CHAIN, ActiveKernel, ChainSettings, StageChain
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE
from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.runtime.egress import TransferRecord
from kvtransit.runtime.metrics import middlebox_metrics
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire import WIRE_VERSION, ErrorCode, clip_message, clip_reason
from kvtransit.wire.errors import ProtocolError
from kvtransit.wire.events import Ack, AckStatus, Bye, Error, Hello, KvBegin, KvChunk, KvEnd, Role

log = logging.getLogger(__name__)

# How far one prefill connection may run ahead of the link: 32 MiB is ~170 ms of a scaled eth-25g link
# (195 MB/s), enough that the link never idles waiting for the kernel, small enough to bound memory.
DEFAULT_INFLIGHT_BYTES = 32 * 1024 * 1024


class Middlebox:
    """The hand-off path: prefill connections in, the stage chain, decode connections out, outcomes back."""

    def __init__(self, scenario: Scenario, decode_addresses: list[tuple[str, int]], *,
                 registry: CollectorRegistry | None = None, clock: Clock | None = None, name: str = "middlebox-0",
                 inflight_bytes: int = DEFAULT_INFLIGHT_BYTES, kernel_threads: int = 1,
                 link_backend: str = "userspace"):
        """`link_backend`: "userspace" (the token bucket shapes the rate) or "tc" (the kernel's qdisc on our
        egress does, and this process keeps only the delay line and the module's hold)."""
        self.scenario = scenario
        self.name = name
        self.clock = clock if clock is not None else MonotonicClock()
        # Faults hold writes for ms to minutes and need no sub-ms precision: they wait without the hand-off
        # clock's yield-spin (runtime/clock.py, for the link's pacing), which a fault holding writes for
        # long would otherwise pay on every hold. An injected clock (a ManualClock in tests) serves both.
        self.fault_clock: Clock = clock if clock is not None else MonotonicClock(spin_s=0.0)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.inflight_bytes = inflight_bytes
        self.link_name = scenario.link
        # Layer-wise or chunked prefill: the prefill's chunks carry their own release times (pipeline.py).
        self.streamed = scenario.handoff == HANDOFF_LAYERWISE or scenario.prefill_chunk > 0
        settings = ChainSettings.from_scenario(scenario, link_backend=link_backend, kernel_threads=kernel_threads,
                                               clock=self.clock, on_transfer_done=self._on_transfer_done)
        self.dilation = settings.dilation
        # Bytes at payload scale → modelled bytes (energy and ops are reported for the modelled KV).
        self.model_bytes_per_byte = settings.model_bytes_per_byte
        self.accounting = HandoffAccounting(middlebox_metrics(self.registry), link_name=self.link_name,
                                            dilation=self.dilation, model_bytes_per_byte=self.model_bytes_per_byte)
        self.chain = StageChain.build(settings, DEFAULT_CHAIN)
        self.faults = FaultChain()
        self.decode_peers = DecodePeers(decode_addresses, name=name, faults=self.faults,
                                        on_ack=self._relay_ack, on_lost=self._lost_behind_us)
        self._owners: dict[int, Endpoint] = {}  # request id → the prefill connection to ack
        self._open: dict[int, Handoff] = {}
        self._tasks = TaskSet(f"{name} hand-offs")
        self._chain_changed()

    # -- the chain, live ----------------------------------------------------------------------------------

    @property
    def link_backend(self) -> str:
        return self.chain.link.backend

    @property
    def kernel(self) -> ActiveKernel:
        """The live kernel: hand-offs that start from now on use it."""
        return self.chain.kernel.kernel

    def describe_chain(self) -> list[dict]:
        return self.chain.describe()

    def reconfigure(self, stage: str, update: dict) -> list[dict]:
        """Change the stage named `stage` live (`PUT /kernel`, `PUT /link`); returns the chain as it now is.
        ConfigError/KernelInputError if refused, and then nothing changed."""
        self.chain.reconfigure(stage, update)
        self._chain_changed()
        return self.describe_chain()

    def _chain_changed(self) -> None:
        self.accounting.declare(self.kernel.name)
        self.accounting.watch_link(self.chain.link)

    # -- decode side --------------------------------------------------------------------------------------

    async def connect_decodes(self, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        """Connect to every decode instance, retrying while they start; a clear error after `timeout_s`."""
        await self.decode_peers.connect_all(timeout_s)

    # -- prefill side -------------------------------------------------------------------------------------

    async def handle_prefill(self, endpoint: Endpoint) -> None:
        """One prefill connection: its KV streams in, acks out."""
        await endpoint.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name=self.name))
        budget = ByteBudget(self.inflight_bytes)
        mine: dict[int, Handoff] = {}
        # Streamed hand-offs this prefill ended whose chunks may not all be released yet (module docstring).
        releasing: dict[int, Handoff] = {}
        lost = "prefill closed the connection mid-request"
        try:
            async for event in endpoint:
                match event:
                    case KvChunk():
                        handoff = mine.get(event.request_id)
                        assert handoff is not None  # the wire guarantees KvBegin came first on this connection
                        await self._ingest_chunk(handoff, event)
                        # A turn of the loop between frames: a prefill sends a layer-wise hand-off's layers as fast
                        # as it makes them (4.6 MB at the layer-wise sweep's scale), and reading them in one callback
                        # held the first layer's release timer 2.2 ms (median) past due; tbf cannot win that back.
                        await asyncio.sleep(0)
                    case KvBegin():
                        mine[event.request_id] = self._begin(event, endpoint, budget)
                    case KvEnd():
                        handoff = mine.pop(event.request_id)
                        handoff.stream.end()
                        if self.streamed:
                            releasing = {rid: h for rid, h in releasing.items() if not h.stream.finished}
                            releasing[event.request_id] = handoff
                    case Error() if event.request_id in mine:
                        mine.pop(event.request_id).stream.abort(f"prefill gave up: {event.message}")
                    case Bye():
                        break
        except (ProtocolError, ConnectionError) as exc:
            lost = f"prefill connection lost mid-request: {exc}"
            raise
        finally:
            for handoff in mine.values():
                handoff.stream.abort(lost)
            for handoff in releasing.values():
                if not handoff.stream.finished:
                    handoff.stream.abort(f"prefill gone mid-step, before all its layers were released ({lost})")

    def _begin(self, begin: KvBegin, source: Endpoint, budget: ByteBudget) -> Handoff:
        stale = self._open.get(begin.request_id)
        if stale is not None and stale.source is not source:
            # A retry from a reconnected prefill: the old attempt's connection is gone (or going). End it, so
            # decode drops its partial stream, and carry the new one. Idempotent by request id.
            stale.stream.abort("superseded by a retry of the same request")
        stream = KvStream(begin.request_id, self.chain, self.kernel, budget)
        handoff = Handoff(begin=begin, source=source, stream=stream, arrived_ns=self.clock.now_ns())
        self._owners[begin.request_id] = source
        self._open[begin.request_id] = handoff
        self._tasks.spawn(self._forward(handoff), f"forward request {begin.request_id}")
        return handoff

    async def _ingest_chunk(self, handoff: Handoff, event: KvChunk) -> None:
        self.accounting.chunk_in(handoff.begin.codec, event.raw_bytes)
        if handoff.failed:
            return  # the hand-off already failed: drain the rest of its stream without keeping it
        await handoff.stream.ingest(event, source_codec=handoff.begin.codec)

    # -- onto the link ------------------------------------------------------------------------------------

    async def _forward(self, handoff: Handoff) -> None:
        rid = handoff.request_id
        peer = self.decode_peers.pick()
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
            await handoff.stream.discard()

    async def _transfer(self, handoff: Handoff, peer: DecodePeer) -> str | None:
        """Carry one hand-off over the link. Returns None when its KvEnd went out, or the reason it was
        abandoned (decode has then been told with an Error naming the request). The transfer always ends
        cleanly, so what was queued on the link (that Error included) is written before the channel frees."""
        rid = handoff.request_id
        endpoint = peer.endpoint
        assert endpoint is not None
        begin = handoff.stream.next_hop_begin(handoff.begin)
        # The hand-off starts, in model time, when the prefill produces the first token (docs/reference.md §4:
        # hand-off = KV ready - first token). The prefill sends the KV during its step, stamped with the
        # step's end, so frames are held until then and paced from then (the link's FIFO permitting): the
        # host's own overhead of producing and framing the bytes is not charged on top of the link's time,
        # and a host too slow to keep up still shows, as bytes that arrive after they were due.
        start_ns = begin.first_token_ns if begin.first_token_ns > 0 else handoff.arrived_ns
        link_stage = self.chain.link
        # Under tc, held by what tbf lets through at once (stages/link.py: TbfMirror): a whole hand-off by the part
        # of its wire bytes a full bucket passes after an idle gap, nothing behind a hand-off still in its queue
        # (pipeline.py: KvStream._burst_head). Streamed, each chunk is paced from its own release time (plus its own
        # such hold: the link may idle between layers, and tbf's bucket fills again meanwhile). The KvBegin goes with
        # the first chunk, ready when it is: were it ready later (the first token), it would hold the link's
        # timeline there; were it ready at "now", a first layer whose bytes reached us after its release (the
        # host's making and relaying take longer than one layer's compute) could not be paced from its release.
        async with link_stage.shaper.transfer(endpoint, label=f"request {rid}") as link:
            outcome = await handoff.stream.deliver(link, kv_end=endpoint.connection.kv_end, ready_ns=start_ns,
                                                   on_sent=self._on_chunk_sent, clock=self.clock,
                                                   burst=link_stage, begin=begin)
        match outcome:
            case Delivered():
                return None
            case Abandoned(reason) | Refused(reason):
                return reason

    def _on_chunk_sent(self, item: ChunkInFlight) -> None:
        self.accounting.chunk_out(item, link_j=self.chain.link.energy_j(item.wire_bytes, self.model_bytes_per_byte),
                                  module_j=self.chain.module.handoff_energy_j(item))

    def _on_transfer_done(self, record: TransferRecord) -> None:
        self.accounting.transfer_done(record)

    # -- outcomes -----------------------------------------------------------------------------------------

    async def _relay_ack(self, ack: Ack, handoff: Handoff | None) -> None:
        ok = ack.status == AckStatus.OK
        self.accounting.outcome(ok=ok, reason=None if ok else f"decode: {ack.detail or 'refused'}")
        owner = self._owners.pop(ack.request_id, None)
        if handoff is not None:
            owner = handoff.source
        if owner is None or owner.is_closing:
            log.info("ack for request %d: its prefill is gone", ack.request_id)
            return
        with contextlib.suppress(ConnectionError, ProtocolError):
            await owner.send(ack)

    async def _lost_behind_us(self, handoff: Handoff, reason: str) -> None:
        """Decode refused the hand-off with an Error, or its connection went: the prefill may send it again."""
        await self._fail(handoff, reason, retryable=True)

    async def _fail(self, handoff: Handoff, reason: str, *, retryable: bool = False) -> None:
        """End a hand-off as failed: count it, tell its prefill. Once only. `retryable`: the link or decode
        failed, not the request: an Error naming the request says "send it again" (the prefill decides, by
        its deadline); otherwise a FAILED Ack says it is over."""
        if handoff.failed:
            return
        handoff.failed = reason
        log.warning("request %d failed%s: %s", handoff.request_id, " (retryable)" if retryable else "", reason)
        self.decode_peers.forget(handoff)
        self.accounting.outcome(ok=False, reason=reason)
        if self._owners.get(handoff.request_id) is handoff.source:
            del self._owners[handoff.request_id]
        owner = handoff.source
        if not owner.is_closing:
            # Clipped to the wire's UTF-8 byte limits: a reason quoting decode or a peer may be any script.
            message = (Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(reason),
                             request_id=handoff.request_id)
                       if retryable else
                       Ack(request_id=handoff.request_id, status=AckStatus.FAILED, t_ns=self.clock.now_ns(),
                           detail=clip_reason(reason)))
            with contextlib.suppress(ConnectionError, ProtocolError):
                await owner.send(message)

    # -- housekeeping -------------------------------------------------------------------------------------

    def stats(self) -> dict:
        return {
            "role": "middlebox", "name": self.name, **self.accounting.stats(),
            "open_handoffs": len(self._open),
            "link": {**self.accounting.link_stats(self.chain.link),
                     # Each decode link's TCP congestion controller (tcp_options.LINK_CONGESTION_CONTROL if allowed).
                     "tcp_congestion_control": {p.name: p.congestion_control for p in self.decode_peers.peers}},
            "chain": self.describe_chain(),
            "faults": self.faults.describe(),
        }

    async def close(self) -> None:
        self.faults.clear()
        await self.decode_peers.close()
        await self._tasks.close()
        self.chain.close()
