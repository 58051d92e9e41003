"""The decode agent: one decode instance (REFERENCE §4).

It reassembles each request's KV from the link (the wire checks every chunk's CRC32C and the whole request's
checksum; a request whose stream breaks is a failed request with the reason, never used), acks it back to
the sender, tells the load generator when the KV was ready, admits requests into the continuous batch
(`DecodeBatcher`, KV reserved up front from `kv_capacity_tokens`), holds each step for the roofline decode
time (with the codec on the prefill GPU, plus the inverse of the KV it admitted: model/decode_plan.py) ×
dilation on absolute deadlines, and streams the step's tokens to every connected load generator.

"KV ready" reaches the load generator as a Tokens entry with token_index 0 stamped at the KvEnd's arrival:
token 0 is the prefill's first token, and this entry says when decode came to hold it (with the KV behind
it). Entries with index ≥ 1 are decode's own tokens.

What to do with each arriving hand-off (take it, re-ack a duplicate, drop it, refuse it) is decided by the pure
`model.kv_arrival.KvArrivals`; this file does the I/O. Steps are held on the injected `clock` (a ManualClock in
tests).

Every taken hand-off is split at its first token (issue 20, model/layerwise.py: `HandoffSplit`): the exposed part
(KV ready − first token) and the hidden part (first KV bytes here → the first token, and the bytes that arrived by
then); sums in `/stats` (`handoff_split`), each request's beside its queue wait. A streamed hand-off (layer-wise,
chunked prefill: its chunks carry their release times) that found the link free is also held against the model's
exposed time (`model.fidelity.prescribed_exposed_s`), here where its release times and bytes are known: the
report's hand-off check in those modes (`streamed_handoff_model` in /stats). The first token of a streamed hand-off
is its KvBegin's stamp, or, with chunked prefill (whose first token is not planned when its KV starts), its last
chunk's release time: the last chunk's compute ends with the first token.

For the first `accuracy_sample` requests it also inverts the codec and compares with the same synthetic KV
regenerated here, so the report carries the codec's real error; beside it, the error of the equal-bytes baseline
quantiser (`model.five_tests.equal_bytes_baseline`: fp8 for ratio 2, fp4-block for about 3.76) on those very
tensors, which the five tests' precision test judges the codec against (REFERENCE §6, §8).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from kvtransit.agents.common import kv_frames
from kvtransit.agents.common.process import (
    Address,
    announce_ready,
    export_timer_share,
    lateness_observer,
    listen,
    new_registry,
    start_http,
)
from kvtransit.agents.common.queue_waits import QUEUE_WAITS_PATH, QueueWaits, handoff_splits_body, queue_waits_body
from kvtransit.agents.common.request_ids import wire_id
from kvtransit.kernels.accuracy import codec_roundtrip
from kvtransit.kernels.registry import decode as codec_decode
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.decode_plan import plan_decode_step
from kvtransit.model.fidelity import (
    handoff_distribution,
    handoff_gap,
    lateness_mean,
    lateness_p99,
    prescribed_exposed_s,
)
from kvtransit.model.five_tests import equal_bytes_baseline
from kvtransit.model.kv_arrival import NO_CLIENT_MESSAGE, KvArrivals, KvEndDecision, Verdict
from kvtransit.model.layerwise import HandoffSplit, link_was_free
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving import DecodeBatcher, ServingRequest
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock, DeadlineSchedule, MonotonicClock
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.errors import ErrorCode, RemoteProtocolError
from kvtransit.wire.events import Ack, AckStatus, Bye, Error, Hello, KvBegin, KvChunk, KvEnd, Role, TokenEntry, Tokens
from kvtransit.wire.limits import MAX_META, WIRE_VERSION, clip_reason

log = logging.getLogger(__name__)

# A Tokens frame carries 20 B per entry in a 64 KiB meta block (wire/limits.py): split larger steps.
TOKENS_PER_FRAME = MAX_META // 32
# How many of the latest streamed hand-offs are kept to tell whether the next found the link free: more than the
# link's lanes can hold at once (REFERENCE §4: 1 by default), however many there are.
RECENT_TRANSFERS_PER_CHANNEL = 8


SampledChunk = tuple[int, int, bytes, bytes, tuple[int, ...]]
"""A sampled request's chunk, copied out of the receive buffer: (layer, codec_id, codec header, payload, shape)."""


@dataclass(frozen=True)
class _Arrived:
    """When one chunk was here, its bytes, and when its KV was released at the prefill (0: with its stream)."""

    at_ns: int
    wire_bytes: int
    raw_bytes: int
    release_ns: int


@dataclass
class _Incoming:
    begin: KvBegin
    began_ns: int
    wire_bytes: int = 0
    sampled: bool = False
    duplicate: bool = False  # a retry of a request already taken: its bytes are drained, never used
    chunks: list[SampledChunk] = field(default_factory=list)  # kept only when sampled
    arrived: list[_Arrived] = field(default_factory=list)  # every chunk's arrival: the hand-off's split

    @property
    def first_token_ns(self) -> int:
        """The first token's stamp: the KvBegin's, else (chunked prefill) the last chunk's release; 0 unknown."""
        return self.begin.first_token_ns or max((a.release_ns for a in self.arrived), default=0)

    @property
    def streamed(self) -> bool:
        return any(a.release_ns for a in self.arrived)


class LinkMeter:
    """What the receiving end of the link saw: bytes and the time the link was busy delivering them.

    A request occupies the link from its KvBegin to its KvEnd; busy time is the union of those intervals,
    so idle gaps between hand-offs do not dilute the achieved rate. A streamed hand-off (layer-wise, chunked
    prefill) also leaves the link idle inside its interval, waiting for a layer's compute: those gaps (`idle`, from
    `streamed_idle_ns`) are taken out too.
    """

    def __init__(self) -> None:
        self.wire_bytes = 0
        self.raw_bytes = 0
        self._union_ns = 0
        self._idle_ns = 0
        self._open = 0
        self._busy_since = 0
        self.transfers = 0

    @property
    def busy_ns(self) -> int:
        return self._union_ns - self._idle_ns

    def idle(self, gap_ns: int) -> None:
        self._idle_ns += gap_ns

    def begin(self, t_ns: int) -> None:
        if self._open == 0:
            self._busy_since = t_ns
        self._open += 1

    def end(self, t_ns: int, wire_bytes: int, raw_bytes: int) -> None:
        self._open -= 1
        if self._open == 0:
            self._union_ns += t_ns - self._busy_since
        self.wire_bytes += wire_bytes
        self.raw_bytes += raw_bytes
        self.transfers += 1

    def abandon(self, t_ns: int) -> None:
        self._open -= 1
        if self._open == 0:
            self._union_ns += t_ns - self._busy_since

    @property
    def achieved_Bps(self) -> float:
        return self.wire_bytes / (self.busy_ns / 1e9) if self.busy_ns else float("nan")


def streamed_idle_ns(began_ns: int, arrived: list[_Arrived], latency_ns: int) -> int:
    """How long a streamed hand-off left the link idle between its KvBegin and its last chunk, waiting for a layer's
    compute: before each chunk, the time from when the chunk before it was here (or the KvBegin) to when this one's
    first byte could be (its release + the link's latency), when that is later. 0 for chunks without release times."""
    idle, previous_ns = 0, began_ns
    for chunk in arrived:
        if chunk.release_ns:
            idle += max(0, chunk.release_ns + latency_ns - previous_ns)
        previous_ns = max(previous_ns, chunk.at_ns)
    return idle


class AccuracyMeter:
    """Relative reconstruction error of K and V, over the sampled requests: ‖x̂ − x‖ / ‖x‖ over all values."""

    def __init__(self) -> None:
        self.err2 = {"k": 0.0, "v": 0.0}
        self.ref2 = {"k": 0.0, "v": 0.0}
        self.requests = 0

    def add(self, reference: np.ndarray, decoded: np.ndarray, heads: int) -> None:
        ref = reference.astype(np.float32).reshape(2, heads, *reference.shape[-2:])
        got = decoded.astype(np.float32).reshape(ref.shape)
        for i, part in enumerate(("k", "v")):
            self.err2[part] += float(np.sum((got[i] - ref[i]) ** 2))
            self.ref2[part] += float(np.sum(ref[i] ** 2))

    def relative(self, part: str) -> float:
        return (self.err2[part] / self.ref2[part]) ** 0.5 if self.ref2[part] else float("nan")


class DecodeAgent:
    def __init__(self, scenario: Scenario, *, name: str, listen: Address, client_listen: Address,
                 metrics_listen: Address, accuracy_sample: int = 8, link_backend: str = "userspace",
                 clock: Clock | None = None):
        """`link_backend` "tc": the kernel shapes the link's rate, so the middlebox cannot see what crossed it;
        this receiving end then exports the link's achieved rate (model units) from its own measurement.
        `clock`: what steps are held on (default: the monotonic clock, its lateness fed to the fidelity guard)."""
        self.scenario = scenario
        self.name = name
        self.listen_address, self.client_listen, self.metrics_listen = listen, client_listen, metrics_listen
        self.registry, shared = new_registry("decode")
        self.metrics = runtime_metrics.decode_metrics(self.registry)
        self.lateness: list[float] = []
        self.clock: Clock = clock if clock is not None else MonotonicClock(
            observe_lateness=lateness_observer(shared, "decode", self.lateness))
        export_timer_share(shared, "decode", self.lateness,
                           lambda: self.shortest_step_wall_s if self.steps else None)
        self.batcher = DecodeBatcher(scenario.kv_capacity_tokens)
        self.layout = scenario.kv_layout
        self.accuracy_sample = accuracy_sample
        # The reference KV for the accuracy sample: built now, not on the first sampled request, so the bank's
        # construction never delays a decode step.
        self._kv = SyntheticKv(self.layout.layers, self.layout.kv_heads, self.layout.head_dim, scenario.seed,
                               sample_path=scenario.kv_sample_path) if accuracy_sample else None
        self._clients: set[Endpoint] = set()
        self._work = asyncio.Event()
        self.link = LinkMeter()
        # The shaped link's latency (and the module's), wall ns: a streamed chunk's bytes cannot be here sooner.
        self._latency_ns = round((scenario.scaled_link.latency_s
                                  + scenario.module.added_latency_s * scenario.effective_dilation) * 1e9)
        if link_backend == "tc":
            model_per_wall = scenario.effective_dilation / scenario.effective_scale
            runtime_metrics.link_achieved_rate_gauge(self.registry).labels(link=scenario.link).set_function(
                lambda: self.link.achieved_Bps * model_per_wall)
        self.accuracy = AccuracyMeter()
        # The equal-bytes baseline on the same sampled tensors (none without a codec: nothing to compare).
        self.baseline_codec = None if scenario.codec == "none" else equal_bytes_baseline(
            scenario.codec_declaration.ratio)
        self.baseline_accuracy = AccuracyMeter()
        self.baseline_bytes = {"raw": 0, "wire": 0}
        self.codecs_seen: set[str] = set()
        self.steps = 0
        self.tokens = 0
        self.shortest_step_wall_s = float("inf")
        self.gpu_energy_j = 0.0
        self.outcomes = {"ok": 0, "failed": 0}
        self.failed_reasons: dict[str, int] = {}
        self._stopping = False
        self.arrivals = KvArrivals(accuracy_sample)  # which hand-offs were taken (dedup), the accuracy sample
        self.handoffs = {"taken": 0, "duplicate": 0, "aborted": 0}
        self.kv_content_mismatches = 0  # sampled raw KV that differed from what the prefill made, yet was used
        # Where hand-off time goes, summed (wall seconds): first token → KvBegin here (sender side and link
        # queue), KvBegin → KvEnd here (the transfer).
        self.phase_s = {"first_token_to_begin": 0.0, "begin_to_end": 0.0, "handoffs": 0}
        # Each request's wait in decode's queue, KV ready → admitted (served at QUEUE_WAITS_PATH for the client).
        self.queue_waits = QueueWaits()
        # The hand-off split at its first token (model seconds, bytes at scale): sums, and each request's.
        self.split_totals = {"exposed_s": 0.0, "hidden_s": 0.0, "hidden_bytes": 0, "bytes": 0, "handoffs": 0}
        self.splits: dict[int, HandoffSplit] = {}
        # Streamed hand-offs against the model's exposed time: (measured, prescribed) model seconds of each that
        # found the link free, how many were measured, and the latest ones' (first release, KV ready) stamps.
        self.streamed_pairs: list[tuple[float, float]] = []
        self.streamed_handoffs = 0
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_TRANSFERS_PER_CHANNEL * scenario.channels)

    # -- to the load generators ----------------------------------------------------------------------------

    async def serve_client(self, endpoint: Endpoint) -> None:
        """One load generator's connection: say Hello, then send it every step's tokens until its Bye."""
        await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name=self.name))
        self._clients.add(endpoint)
        try:
            while (event := await endpoint.next_event()) is not None:
                if isinstance(event, Bye):
                    break
        finally:
            self._clients.discard(endpoint)

    async def _to_clients(self, event) -> None:
        for client in list(self._clients):
            try:
                await client.send(event)
            except (ConnectionError, RuntimeError) as exc:
                log.warning("dropping load generator %s: %s", client.peername, exc)
                self._clients.discard(client)

    async def _tokens(self, entries: list[TokenEntry]) -> None:
        for start in range(0, len(entries), TOKENS_PER_FRAME):
            await self._to_clients(Tokens(entries=tuple(entries[start:start + TOKENS_PER_FRAME])))

    async def _fail(self, request_id: int, reason: str) -> None:
        self.outcomes["failed"] += 1
        self.failed_reasons[reason] = self.failed_reasons.get(reason, 0) + 1
        self.metrics.requests.labels(outcome="failed").inc()
        await self._to_clients(Error(code=ErrorCode.REQUEST_FAILED, message=reason, request_id=request_id))

    # -- from the link ---------------------------------------------------------------------------------------

    async def serve_kv(self, endpoint: Endpoint) -> None:
        """One KV link from a middlebox: say Hello, then reassemble each hand-off and act on its KvEnd."""
        await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name=self.name))
        incoming: dict[int, _Incoming] = {}
        reason = "kv link closed mid-stream"
        try:
            while (event := await endpoint.next_event()) is not None:
                if isinstance(event, KvBegin):
                    now = self.clock.now_ns()
                    arrival = self.arrivals.begin(event.request_id)
                    incoming[event.request_id] = _Incoming(event, now, sampled=arrival.sampled,
                                                           duplicate=arrival.duplicate)
                    self.link.begin(now)
                elif isinstance(event, KvChunk):
                    item = incoming[event.request_id]
                    item.wire_bytes += len(event.payload)
                    item.arrived.append(_Arrived(self.clock.now_ns(), len(event.payload), event.raw_bytes,
                                                 event.release_ns))
                    if item.sampled:
                        item.chunks.append((event.layer, event.codec_id, bytes(event.codec_header),
                                            bytes(event.payload), event.shape))
                elif isinstance(event, KvEnd):
                    await self._kv_end(endpoint, incoming.pop(event.request_id))
                elif isinstance(event, Error) and event.request_id in incoming:
                    # The sender gave up on this stream (the wire has closed it): drop what arrived.
                    self._abort(incoming.pop(event.request_id), f"sender gave up: {event.message}")
                elif isinstance(event, Bye):
                    break
        except RemoteProtocolError as exc:
            reason = f"kv stream broken ({exc.code.name.lower().replace('_', ' ')})"
            raise
        finally:
            # Whatever was mid-stream when the connection broke or closed is dropped, never used. The request
            # is not failed here: its sender holds the KV until acked and sends it again (or gives up and
            # says so to the client), so the outcome is the sender's to decide.
            for request_id in list(incoming):
                self._abort(incoming.pop(request_id), reason)

    async def _kv_end(self, endpoint: Endpoint, item: _Incoming) -> None:
        """The whole KV is here: act on what `KvArrivals.end` decides (model/kv_arrival.py says why each)."""
        begin = item.begin
        request = ServingRequest(begin.request_id, begin.prompt_tokens, begin.output_tokens)
        decision = self.arrivals.end(request, self.batcher, began_duplicate=item.duplicate, stopping=self._stopping,
                                     has_clients=bool(self._clients))
        if decision.verdict is Verdict.DUPLICATE:
            await self._duplicate(endpoint, item, decision)
        elif decision.verdict in (Verdict.STOPPING, Verdict.NO_CLIENT):
            self._abort(item, decision.reason)
            if decision.verdict is Verdict.NO_CLIENT:  # the Error naming the request tells the sender to retry
                await endpoint.send(Error(code=ErrorCode.OVERLOADED, request_id=begin.request_id,
                                          message=NO_CLIENT_MESSAGE))
        else:
            await self._kv_ready(endpoint, item, request, decision)

    def _abort(self, item: _Incoming, reason: str) -> None:
        self.link.abandon(self.clock.now_ns())
        self.handoffs["aborted"] += 1
        self.metrics.kv_handoffs.labels(outcome="aborted").inc()
        log.info("dropped the partial KV of request %d: %s", item.begin.request_id, reason)

    async def _duplicate(self, endpoint: Endpoint, item: _Incoming, decision: KvEndDecision) -> None:
        """A hand-off we already took, sent again (our Ack was lost with a link or middlebox): drop it and
        answer as we did the first time, so the sender can release it. Idempotent by request id."""
        now = self.clock.now_ns()
        self.link.abandon(now)
        self.handoffs["duplicate"] += 1
        self.metrics.kv_handoffs.labels(outcome="duplicate").inc()
        await endpoint.send(Ack(request_id=item.begin.request_id, status=_ack_status(decision), t_ns=now,
                                detail=decision.reason))

    async def _kv_ready(self, endpoint: Endpoint, item: _Incoming, request: ServingRequest,
                        decision: KvEndDecision) -> None:
        """Taken (accepted or refused): count the transfer, then answer."""
        ready_ns = self.clock.now_ns()
        begin = item.begin
        self.handoffs["taken"] += 1
        self.metrics.kv_handoffs.labels(outcome="taken").inc()
        if item.streamed:
            self.link.idle(streamed_idle_ns(item.began_ns, item.arrived, self._latency_ns))
        self.link.end(ready_ns, item.wire_bytes, begin.raw_bytes)
        if begin.first_token_ns:
            self.phase_s["first_token_to_begin"] += (item.began_ns - begin.first_token_ns) / 1e9
            self.phase_s["begin_to_end"] += (ready_ns - item.began_ns) / 1e9
            self.phase_s["handoffs"] += 1
        self._split(item, ready_ns)
        self.codecs_seen.add(begin.codec)
        self.metrics.kv_received_bytes.labels(stage="wire").inc(item.wire_bytes)
        self.metrics.kv_received_bytes.labels(stage="raw").inc(begin.raw_bytes)
        if decision.verdict is Verdict.REFUSE:
            await endpoint.send(Ack(request_id=begin.request_id, status=AckStatus.FAILED, t_ns=ready_ns,
                                    detail=clip_reason(decision.reason)))
            await self._fail(begin.request_id, decision.client_reason)
            return
        # The client hears that we hold the KV before the sender may release it (the Ack): if we die between
        # the two, the client knows whom to blame, and the sender still holds the KV.
        await self._tokens([TokenEntry(request_id=begin.request_id, token_index=0, t_ns=ready_ns)])
        await endpoint.send(Ack(request_id=begin.request_id, status=AckStatus.OK, t_ns=ready_ns))
        self.queue_waits.ready(begin.request_id, ready_ns)
        self.batcher.enqueue(request)
        self.metrics.waiting.set(self.batcher.waiting)
        self._work.set()
        if item.sampled:
            # Off the event loop: inverting the codec takes milliseconds a layer, which would make steps late.
            await asyncio.to_thread(self._measure_accuracy, item)

    def _split(self, item: _Incoming, ready_ns: int) -> None:
        """The taken hand-off split at its first token (model/layerwise.py), summed and kept per request; a
        streamed one that found the link free is also held against the model's exposed time."""
        first_token_ns = item.first_token_ns
        if not first_token_ns or not item.arrived:
            return  # no first token known (a sender that stamps none) or no bytes: nothing to split
        per_ns = 1e-9 / self.scenario.effective_dilation  # wall ns → model seconds
        split = HandoffSplit.from_stamps(
            first_token_ns=first_token_ns, first_bytes_ns=item.arrived[0].at_ns, ready_ns=ready_ns,
            hidden_bytes=sum(a.wire_bytes for a in item.arrived if a.at_ns <= first_token_ns),
            total_bytes=item.wire_bytes, seconds_per_ns=per_ns)
        self.splits[item.begin.request_id] = split
        self.metrics.handoff_exposed_seconds.observe(split.exposed_s)
        self.metrics.handoff_hidden_seconds.observe(split.hidden_s)
        self.metrics.handoff_bytes.labels(phase="hidden").inc(split.hidden_bytes)
        self.metrics.handoff_bytes.labels(phase="exposed").inc(split.bytes - split.hidden_bytes)
        totals = self.split_totals
        totals["exposed_s"] += split.exposed_s
        totals["hidden_s"] += split.hidden_s
        totals["hidden_bytes"] += split.hidden_bytes
        totals["bytes"] += split.bytes
        totals["handoffs"] += 1
        if item.streamed:
            self._against_the_model(item, first_token_ns, ready_ns, split.exposed_s)

    def _against_the_model(self, item: _Incoming, first_token_ns: int, ready_ns: int, exposed_s: float) -> None:
        scenario = self.scenario
        first_release_ns = min(a.release_ns or first_token_ns for a in item.arrived)
        free = link_was_free(first_release_ns, self._recent, scenario.channels)
        self._recent.append((first_release_ns, ready_ns))
        self.streamed_handoffs += 1
        if not free:
            return
        per_ns, scale = 1e-9 / scenario.effective_dilation, scenario.effective_scale
        chunks = [(((a.release_ns or first_token_ns) - first_token_ns) * per_ns, a.raw_bytes / scale,
                   a.wire_bytes / scale) for a in item.arrived]
        self.streamed_pairs.append((exposed_s, prescribed_exposed_s(scenario, chunks, item.begin.n_layers)))

    def _streamed_model_stats(self) -> dict | None:
        """The streamed hand-offs that found the link free, exposed time against the model (model/fidelity.py's
        hand-off rule on them); None when none was streamed."""
        if not self.streamed_handoffs:
            return None
        measured = [m for m, _ in self.streamed_pairs]
        prescribed = [p for _, p in self.streamed_pairs]
        return {"check": handoff_gap(measured, prescribed, self.scenario.effective_dilation).as_dict(),
                "distribution": handoff_distribution(measured, prescribed, self.streamed_handoffs)}

    def _measure_accuracy(self, item: _Incoming) -> None:
        layout, tokens = self.layout, item.begin.prompt_tokens
        assert self._kv is not None  # only sampled requests get here, and sampling is on only with the reference
        # Each layer's decoded rows, chunk by chunk: runs of rows that make up a layer's rows for one token segment
        # (chunked prefill cuts along tokens too, handoff_frames.py), the segments in token order.
        layers: dict[int, list[list[np.ndarray]]] = {}
        rows_per_layer = 2 * layout.kv_heads
        for layer, codec_id, header, payload, shape in item.chunks:
            if codec_id == kv_frames.IDENTITY_CODEC_ID:
                from ml_dtypes import bfloat16

                decoded = np.frombuffer(payload, dtype=bfloat16).reshape(shape)
            else:
                decoded = codec_decode(header, payload)
            segments = layers.setdefault(layer, [])
            if not segments or sum(piece.shape[0] for piece in segments[-1]) == rows_per_layer:
                segments.append([])
            segments[-1].append(decoded)
        raw = all(codec_id == kv_frames.IDENTITY_CODEC_ID for _, codec_id, *_ in item.chunks)
        for layer, segments in layers.items():
            decoded = np.concatenate([np.concatenate(pieces, axis=0) for pieces in segments], axis=1)
            reference = kv_frames.as_rows(self._kv.layer(item.begin.request_id, layer, tokens))
            if raw and decoded.tobytes() != np.ascontiguousarray(reference).tobytes():
                # Raw KV must arrive bit for bit: a difference is corruption the wire's CRCs missed, and it was
                # used. The ledger reports this count (model/ledger_check.py: corrupted), once per request.
                raw = False
                self.kv_content_mismatches += 1
                log.error("request %d layer %d: raw KV differs from what the prefill made", item.begin.request_id,
                          layer)
            self.accuracy.add(reference, decoded, layout.kv_heads)
            if self.baseline_codec is not None:
                rows = np.ascontiguousarray(reference)
                baseline, wire_bytes = codec_roundtrip(self.baseline_codec, rows)
                self.baseline_accuracy.add(reference, baseline, layout.kv_heads)
                self.baseline_bytes["raw"] += rows.nbytes
                self.baseline_bytes["wire"] += wire_bytes
        self.accuracy.requests += 1
        for part in ("k", "v"):
            self.metrics.codec_relative_error.labels(codec=item.begin.codec, stage=part).set(
                self.accuracy.relative(part))

    # -- the step loop -----------------------------------------------------------------------------------

    async def step_loop(self) -> None:
        """Admit, hold each step of the batch for its planned time on the clock, send its tokens; idle when empty."""
        scenario = self.scenario
        schedule: DeadlineSchedule | None = None  # None: idle, the next step starts now
        # Prompt lengths admitted since the last step ran: the next step also inverts their KV when the codec
        # ran on the prefill GPU (model/decode_plan.py).
        admitted_prompts: list[int] = []
        while True:
            admitted = self.batcher.admit()
            admitted_prompts.extend(r.prompt_tokens for r in admitted)
            self._admitted(admitted)
            self.metrics.waiting.set(self.batcher.waiting)
            self.metrics.running.set(self.batcher.running)
            self.metrics.kv_reserved_tokens.set(self.batcher.reserved_tokens)
            if not self.batcher.running:
                schedule = None
                self._work.clear()
                await self._work.wait()
                continue
            plan = plan_decode_step(scenario, self.batcher.running, self.batcher.context_tokens, admitted_prompts)
            admitted_prompts.clear()
            # Back-to-back steps start at the previous deadline, not at the (late) wake-up: step k is due at
            # t0 + Σ durations, so timer lateness never accumulates into TPOT (DESIGN §2).
            schedule = schedule or DeadlineSchedule(self.clock)
            await schedule.hold(plan.wall_s)
            result = self.batcher.step()
            t_ns = self.clock.now_ns()
            self.steps += 1
            self.tokens += len(result.tokens)
            self.shortest_step_wall_s = min(self.shortest_step_wall_s, plan.wall_s)
            self.metrics.step_seconds.observe(plan.model_s)
            self.metrics.tokens.inc(len(result.tokens))
            self.gpu_energy_j += plan.energy_j
            self.metrics.gpu_energy_joules.inc(plan.energy_j)
            for _ in result.finished:
                self.outcomes["ok"] += 1
                self.metrics.requests.labels(outcome="ok").inc()
            await self._tokens([TokenEntry(request_id=wire_id(rid), token_index=index, t_ns=t_ns)
                                for rid, index in result.tokens])

    def _admitted(self, requests: list[ServingRequest]) -> None:
        """Each admitted request's queue wait, KV ready → now (the step boundary that admitted it), model seconds."""
        now = self.clock.now_ns()
        for request in requests:
            wait_s = self.queue_waits.admitted(wire_id(request.request_id), now, self.scenario.model_s)
            if wait_s is not None:
                self.metrics.queue_wait_seconds.observe(wait_s)

    # -- stats ---------------------------------------------------------------------------------------------

    async def _queue_waits_route(self, _request) -> dict:
        """Each request's queue wait (agents/common/queue_waits.py) and, beside it, its hand-off split (model
        seconds and bytes at scale; `handoff_split`, a key the queue-wait reader does not look at)."""
        return {**queue_waits_body(self.queue_waits.waits_s),
                **handoff_splits_body({rid: asdict(split) for rid, split in self.splits.items()})}

    def stats(self) -> dict:
        link = self.link
        return {
            "role": "decode",
            "name": self.name,
            "steps": self.steps,
            "tokens": self.tokens,
            "gpu_energy_j": self.gpu_energy_j,
            "requests": dict(self.outcomes),
            "kv_handoffs": dict(self.handoffs),
            "kv_content_mismatches": self.kv_content_mismatches,
            "failed_reasons": dict(self.failed_reasons),
            "link": {"wire_bytes": link.wire_bytes, "raw_bytes": link.raw_bytes, "busy_s": link.busy_ns / 1e9,
                     "transfers": link.transfers, "achieved_Bps": link.achieved_Bps},
            "accuracy": {"codecs": sorted(self.codecs_seen), "sampled_requests": self.accuracy.requests,
                         "k_relative_error": self.accuracy.relative("k"),
                         "v_relative_error": self.accuracy.relative("v"),
                         **self._baseline_stats()},
            "timer_lateness_p99_s": lateness_p99(self.lateness),
            "timer_lateness_mean_s": lateness_mean(self.lateness),
            "timer_wakeups": len(self.lateness),
            # What the holds wait on: "timerfd" (sub-ms, sleeping) or "loop" (ms timer + 1 ms spin).
            "timer": self.clock.timer,
            "handoff_phases_s": dict(self.phase_s),
            "handoff_split": dict(self.split_totals),
            "streamed_handoff_model": self._streamed_model_stats(),
            "shortest_step_wall_s": self.shortest_step_wall_s if self.steps else None,
        }

    def _baseline_stats(self) -> dict:
        """The equal-bytes baseline's error on the same sampled tensors, and its measured ratio (raw / wire bytes)."""
        measured = self.baseline_codec is not None and self.baseline_bytes["wire"] > 0
        return {"baseline_codec": self.baseline_codec,
                "baseline_k_relative_error": self.baseline_accuracy.relative("k") if measured else None,
                "baseline_v_relative_error": self.baseline_accuracy.relative("v") if measured else None,
                "baseline_ratio": self.baseline_bytes["raw"] / self.baseline_bytes["wire"] if measured else None}

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        kv_server = await listen(self.listen_address, "--listen", self.serve_kv, Role.DECODE, Role.MIDDLEBOX)
        client_server = await listen(self.client_listen, "--client-listen", self.serve_client, Role.DECODE,
                                     Role.LOADGEN)
        http = await start_http(self.metrics_listen, self.registry, self.stats)
        http.route("GET", QUEUE_WAITS_PATH, self._queue_waits_route, public=True)
        announce_ready("decode", self.name, listen_port=kv_server.port, client_port=client_server.port,
                       metrics_port=http.port)
        loops = TaskSet("decode")
        step = loops.spawn(self.step_loop(), "step loop")
        stopper = loops.spawn(stop.wait(), "stop")
        try:
            done, _ = await asyncio.wait([step, stopper], return_when=asyncio.FIRST_COMPLETED)
            if step in done and (failure := step.exception()) is not None:
                raise failure
        finally:
            self._stopping = True  # from here no KV is acked (see model/kv_arrival.py: stopping)
            await loops.close()
            await kv_server.shutdown(1.0)
            for client in list(self._clients):
                client.abort()
            await client_server.shutdown(1.0)
            await http.close()


def _ack_status(decision: KvEndDecision) -> AckStatus:
    return AckStatus.OK if decision.ack_ok else AckStatus.FAILED
