"""The decode agent: one decode instance (REFERENCE §4).

It reassembles each request's KV from the link (the wire checks every chunk's CRC32C and the whole request's
checksum; a request whose stream breaks is a failed request with the reason, never used), acks it back to
the sender, tells the load generator when the KV was ready, admits requests into the continuous batch
(`DecodeBatcher`, KV reserved up front from `kv_capacity_tokens`), holds each step for the roofline decode
time (with the codec on the prefill GPU, plus the inverse of the KV it admitted: model/serving/decode_plan.py) ×
dilation on absolute deadlines, and streams the step's tokens to every connected load generator.

"KV ready" reaches the load generator as a Tokens entry with token_index 0 stamped at the KvEnd's arrival:
token 0 is the prefill's first token, and this entry says when decode came to hold it (with the KV behind
it). Entries with index ≥ 1 are decode's own tokens.

A request the load generator withdraws (an Error naming it: its client went away) is `cancel`led: out of the
batch, its KV reservation freed and no more tokens made for it; if its KV has not arrived yet, the id is
remembered and that KV is dropped when it does, with a FAILED Ack so the hops behind release theirs.

What to do with each arriving hand-off (take it, re-ack a duplicate, drop it, refuse it) is decided by the pure
`model.kv_arrival.KvArrivals`; this file does the I/O. Steps are held on the injected `clock` (a ManualClock in
tests).

Beside this loop, one module per job: `incoming.py` (a hand-off being reassembled), `link_meter.py` (the link's
bytes and busy time at the receiving end), `handoff_splits.py` (each hand-off split at its first token, streamed ones
held against the model), `accuracy_sample.py` (the codec's measured error on the first `accuracy_sample` requests,
with the equal-bytes baseline's on the same tensors). With `--decode-tp N` this process is rank 0 of a TP group
(`flows/tp/group/leader.py`); `flows/tp/group/steps.py` runs and measures each step (hold the shard's compute,
the real collectives with the followers, hold the rest of the step's collective time: flows/tp/group_step.py says which
part is real); a group that fails fails every request in the batch with its reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from dataclasses import asdict

from kvtransit.agents.common.queue_waits import QUEUE_WAITS_PATH, QueueWaits, handoff_splits_body, queue_waits_body
from kvtransit.agents.common.request_ids import wire_id
from kvtransit.agents.decode.accuracy_sample import AccuracySample
from kvtransit.agents.decode.handoff_splits import HandoffSplits
from kvtransit.agents.decode.incoming import Arrived, Incoming
from kvtransit.agents.decode.link_meter import LinkMeter, streamed_idle_ns
from kvtransit.agents.decode.model_accuracy import ModelAccuracy
from kvtransit.agents.process import (
    Address,
    announce_ready,
    listen,
    new_registry,
    start_http,
    step_clock,
    timer_priority,
)
from kvtransit.flows.selection.decode_legs import RemoteKvFailed, RemoteKvLegs
from kvtransit.flows.tp.group.leader import GroupFailed, GroupLeader, LeaderConfig
from kvtransit.flows.tp.group.steps import TpSteps
from kvtransit.model.judge.fidelity import lateness_mean, lateness_p99
from kvtransit.model.scenario import REAL_MODEL_KV, Scenario
from kvtransit.model.serving.decode_plan import DecodeStepPlan, plan_decode_step
from kvtransit.model.serving.kv_arrival import KNOWN_REQUESTS, NO_CLIENT_MESSAGE, KvArrivals, KvEndDecision, Verdict
from kvtransit.model.serving.policies import DecodeBatcher, ServingRequest
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock, DeadlineSchedule, wake_stamp_ns
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.errors import ErrorCode, RemoteProtocolError
from kvtransit.wire.events import Ack, AckStatus, Bye, Error, Hello, KvBegin, KvChunk, KvEnd, Role, TokenEntry, Tokens
from kvtransit.wire.limits import MAX_META, WIRE_VERSION, clip_reason

log = logging.getLogger(__name__)

# A Tokens frame carries 20 B per entry in a 64 KiB meta block (wire/limits.py): split larger steps.
TOKENS_PER_FRAME = MAX_META // 32

class DecodeAgent:
    def __init__(self, scenario: Scenario, *, name: str, listen: Address, client_listen: Address,
                 metrics_listen: Address, accuracy_sample: int = 8, link_backend: str = "userspace",
                 clock: Clock | None = None, tp_group: LeaderConfig | None = None,
                 remote_kv_listen: Address | None = None):
        """`link_backend` "tc": the kernel shapes the link's rate, so the middlebox cannot see what crossed it;
        this receiving end then exports the link's achieved rate (model units) from its own measurement.
        `clock`: what steps are held on (default: the monotonic clock, its lateness fed to the fidelity guard).
        `tp_group`: with `decode_tp` > 1, the follower ranks to lead (the launcher starts them first).
        `remote_kv_listen`: with `--kv-placement remote`, where the middlebox connects for the remote legs."""
        self.scenario = scenario
        self.name = name
        self.listen_address, self.client_listen, self.metrics_listen = listen, client_listen, metrics_listen
        self.registry, shared = new_registry("decode")
        self.metrics = runtime_metrics.decode_metrics(self.registry)
        self.clock, self.lateness = step_clock(shared, "decode", clock,
                                               lambda: self.shortest_step_wall_s if self.steps else None)
        self.batcher = DecodeBatcher(scenario.decode_kv_capacity_tokens)
        if (tp_group is None) != (scenario.decode_tp == 1):
            raise ValueError(f"decode_tp {scenario.decode_tp} needs its group's followers (--tp-group), and only then")
        link = scenario.scaled_scaleup_link
        self.group = (GroupLeader(tp_group, self.clock, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s)
                      if tp_group is not None else None)
        self.tp_steps = (TpSteps(scenario, "decode", self.registry, size=scenario.decode_tp,
                                 parallelism="ep" if scenario.decode_ep else "tp") if tp_group is not None else None)
        self.link = LinkMeter()
        # --kv-placement remote: each step fetches its long-context requests' remote KV first (remote_kv.py).
        self.remote = (RemoteKvLegs(scenario, self.clock, runtime_metrics.remote_kv_metrics(self.registry),
                                    self._handoffs_on_link, self.link.shared) if scenario.remote_kv else None)
        # Hand-offs on the link now (request id -> since, ns) and recently ((since, end) ns): whether a step's remote
        # legs had the link to themselves.
        self._handoffs_now: dict[int, int] = {}
        self._handoffs_done: deque[tuple[int, int]] = deque(maxlen=256)
        self.remote_kv_listen = remote_kv_listen or Address(listen.host, 0)
        self._clients: set[Endpoint] = set()
        self._work = asyncio.Event()
        # The shaped link's latency (and the module's), wall ns: a streamed chunk's bytes cannot be here sooner.
        self._latency_ns = round((scenario.scaled_link.latency_s
                                  + scenario.module.added_latency_s * scenario.effective_dilation) * 1e9)
        if link_backend == "tc":
            model_per_wall = scenario.effective_dilation / scenario.effective_scale
            runtime_metrics.link_achieved_rate_gauge(self.registry).labels(link=scenario.link).set_function(
                lambda: self.link.achieved_Bps * model_per_wall)
        self.sample = AccuracySample(scenario, accuracy_sample, self.metrics.codec_relative_error)
        # `--kv-sample real`: the real model reads the real-KV hand-offs as they arrived (model_accuracy.py).
        self.model_accuracy = (ModelAccuracy(scenario, self.metrics) if scenario.kv_sample == REAL_MODEL_KV
                               else None)
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
        # Withdrawn by their client: by where each was (in the batch, or its KV not here yet: with several decodes
        # the client tells each, as it cannot know which one the KV goes to), and the ids of the latter, whose KV is
        # dropped when it comes (bounded as KvArrivals' memory is, oldest forgotten first).
        self.cancelled = {"batch": 0, "before_kv": 0}
        self._withdrawn: OrderedDict[int, str] = OrderedDict()
        # Where hand-off time goes, summed (wall seconds): first token → KvBegin here (sender side and link
        # queue), KvBegin → KvEnd here (the transfer).
        self.phase_s = {"first_token_to_begin": 0.0, "begin_to_end": 0.0, "handoffs": 0}
        # Each request's wait in decode's queue, KV ready → admitted (served at QUEUE_WAITS_PATH for the client).
        self.queue_waits = QueueWaits()
        # The hand-off split at its first token (model seconds, bytes at scale): sums, each request's, and the
        # streamed ones against the model.
        self.splits = HandoffSplits(scenario, self.metrics)

    # -- to the load generators ----------------------------------------------------------------------------

    async def serve_client(self, endpoint: Endpoint) -> None:
        """One load generator's connection: say Hello, then send it every step's tokens until its Bye."""
        await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name=self.name))
        self._clients.add(endpoint)
        try:
            while (event := await endpoint.next_event()) is not None:
                if isinstance(event, Error) and event.request_id is not None:
                    self.cancel(event.request_id, event.message)
                elif isinstance(event, Bye):
                    break
        finally:
            self._clients.discard(endpoint)

    def cancel(self, request_id: int, reason: str) -> None:
        """The client withdrew the request (module docstring): no token is made for it from the next step on."""
        if self.batcher.cancel(request_id):
            self.cancelled["batch"] += 1
            self.metrics.waiting.set(self.batcher.waiting)
            self.metrics.running.set(self.batcher.running)
            self.metrics.kv_reserved_tokens.set(self.batcher.reserved_tokens)
        elif request_id not in self.arrivals:  # its KV is not here yet (or never comes: dropped at prefill)
            self.cancelled["before_kv"] += 1
            self._withdrawn[request_id] = reason or "cancelled by its client"
            while len(self._withdrawn) > KNOWN_REQUESTS:
                self._withdrawn.popitem(last=False)

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
        incoming: dict[int, Incoming] = {}
        reason = "kv link closed mid-stream"
        try:
            while (event := await endpoint.next_event()) is not None:
                if isinstance(event, KvBegin):
                    now = self.clock.now_ns()
                    arrival = self.arrivals.begin(event.request_id)
                    # A real-KV hand-off is read by the real model, not the synthetic accuracy sample: its KV is
                    # not the synthetic bank's.
                    real = (self.model_accuracy is not None and not arrival.duplicate
                            and self.scenario.carries_real_kv(event.request_id))
                    incoming[event.request_id] = Incoming(event, now, sampled=arrival.sampled or real,
                                                           duplicate=arrival.duplicate, real=real)
                    self.link.begin(now)
                    if self.remote is not None:  # on the link since its first token (the middlebox held it till then)
                        self._handoffs_now[event.request_id] = min(now, event.first_token_ns or now)
                elif isinstance(event, KvChunk):
                    item = incoming[event.request_id]
                    item.wire_bytes += len(event.payload)
                    item.arrived.append(Arrived(self.clock.now_ns(), len(event.payload), event.raw_bytes,
                                                 event.release_ns))
                    if item.sampled:
                        item.chunks.append((event.layer, event.codec_id, bytes(event.codec_header),
                                            bytes(event.payload), event.shape))
                elif isinstance(event, KvEnd):
                    self._handoff_off_link(event.request_id)
                    await self._kv_end(endpoint, incoming.pop(event.request_id))
                elif isinstance(event, Error) and event.request_id in incoming:
                    # The sender gave up on this stream (the wire has closed it): drop what arrived.
                    self._handoff_off_link(event.request_id)
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
                self._handoff_off_link(request_id)
                self._abort(incoming.pop(request_id), reason)

    def _handoff_off_link(self, request_id: int) -> None:
        """A hand-off left the link (its KvEnd, or its stream ended): remembered beside the remote legs."""
        since = self._handoffs_now.pop(request_id, None)
        if since is not None and self.remote is not None:
            end = self.clock.now_ns()
            self._handoffs_done.append((since, end))
            self.remote.met_handoff(request_id, since, end)

    def _handoffs_on_link(self, start_ns: int, end_ns: int) -> bool:
        return (any(since < end_ns for since in self._handoffs_now.values())
                or any(s < end_ns and start_ns < e for s, e in self._handoffs_done))

    async def _kv_end(self, endpoint: Endpoint, item: Incoming) -> None:
        """The whole KV is here: act on what `KvArrivals.end` decides (model/serving/kv_arrival.py says why each)."""
        begin = item.begin
        if (withdrawn := self._withdrawn.get(begin.request_id)) is not None:
            # Its client went away before it came: never decoded (kept in mind, so a resend is dropped too). The
            # FAILED Ack ends it for the middlebox and the prefill (which released it already: it ignores it).
            self._abort(item, withdrawn)
            await endpoint.send(Ack(request_id=begin.request_id, status=AckStatus.FAILED, t_ns=self.clock.now_ns(),
                                    detail=clip_reason(withdrawn)))
            return
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

    def _abort(self, item: Incoming, reason: str) -> None:
        self.link.abandon(self.clock.now_ns())
        self.handoffs["aborted"] += 1
        self.metrics.kv_handoffs.labels(outcome="aborted").inc()
        log.info("dropped the partial KV of request %d: %s", item.begin.request_id, reason)

    async def _duplicate(self, endpoint: Endpoint, item: Incoming, decision: KvEndDecision) -> None:
        """A hand-off we already took, sent again (our Ack was lost with a link or middlebox): drop it and
        answer as we did the first time, so the sender can release it. Idempotent by request id."""
        now = self.clock.now_ns()
        self.link.abandon(now)
        self.handoffs["duplicate"] += 1
        self.metrics.kv_handoffs.labels(outcome="duplicate").inc()
        await endpoint.send(Ack(request_id=item.begin.request_id, status=_ack_status(decision), t_ns=now,
                                detail=decision.reason))

    async def _kv_ready(self, endpoint: Endpoint, item: Incoming, request: ServingRequest,
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
        self.splits.record(item, ready_ns)
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
        if item.real:
            assert self.model_accuracy is not None  # `real` is set only with it
            self.model_accuracy.submit(item)  # a task of its own: the real model takes seconds
        elif item.sampled:
            # Off the event loop: inverting the codec takes milliseconds a layer, which would make steps late.
            await asyncio.to_thread(self.sample.measure, item)

    # -- the step loop -----------------------------------------------------------------------------------

    async def step_loop(self) -> None:
        """Admit, hold each step of the batch for its planned time on the clock, send its tokens; idle when empty."""
        scenario = self.scenario
        schedule: DeadlineSchedule | None = None  # None: idle, the next step starts now
        # Prompt lengths admitted since the last step ran: the next step also inverts their KV when the codec
        # ran on the prefill GPU (model/serving/decode_plan.py).
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
            remote_ids = self._remote_ids()
            context_tokens = self.batcher.context_tokens
            if remote_ids:
                assert self.remote is not None
                context_tokens += self.remote.attended_tokens(len(remote_ids))
            plan = plan_decode_step(scenario, self.batcher.running, context_tokens, admitted_prompts)
            admitted_prompts.clear()
            # Back-to-back steps start at the previous deadline, not at the (late) wake-up: step k is due at
            # t0 + Σ durations, so timer lateness never accumulates into TPOT (DESIGN §2).
            schedule = schedule or DeadlineSchedule(self.clock)
            if remote_ids:
                try:
                    await self._remote_legs(schedule, remote_ids)
                except RemoteKvFailed as exc:
                    await self._fail_requests(remote_ids, str(exc))
                    schedule = None
                    continue
            if plan.group is None:
                late_ns = await schedule.hold(plan.wall_s)
            else:
                try:
                    late_ns = await self._group_step(schedule, plan)
                except GroupFailed as exc:
                    await self._fail_batch(str(exc))
                    schedule = None
                    continue
            t_ns = wake_stamp_ns(schedule.deadline_ns, late_ns)  # its tokens' stamp (wake_stamp_ns says why)
            result = self.batcher.step()
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

    async def _group_step(self, schedule: DeadlineSchedule, plan: DecodeStepPlan) -> int:
        """A TP group's step (flows/tp/group/steps.py: TpSteps.run); the lateness of its end."""
        assert self.group is not None and self.tp_steps is not None
        fresh_start_ns = schedule.start_ns if schedule.steps == 0 else None
        compute_end_ns = schedule.add(self.scenario.wall_s(plan.compute_s))
        end_ns = schedule.add(self.scenario.wall_s(plan.collective_s))
        return await self.tp_steps.run(self.group, self.clock, plan, fresh_start_ns=fresh_start_ns,
                                       compute_end_ns=compute_end_ns, end_ns=end_ns)

    def _remote_ids(self) -> list[int]:
        """The running requests of the long-context class (flows/selection/remote_class.py: in_remote_class)."""
        if self.remote is None:
            return []
        return [wire_id(r) for r in self.batcher.running_ids if self.scenario.is_remote_request(wire_id(r))]

    async def _remote_legs(self, schedule: DeadlineSchedule, remote_ids: list[int]) -> None:
        """The step's remote legs from its due start; the schedule then runs on from when the pages were held: when
        they were due, or later when they came late (the compute cannot start before its KV is here; the lateness is
        the legs', counted there, not the step timer's)."""
        assert self.remote is not None
        start_ns = schedule.deadline_ns
        held_ns = await self.remote.fetch(self.steps, remote_ids, start_ns)
        schedule.add(max(0, held_ns - start_ns) / 1e9)

    async def _fail_batch(self, reason: str) -> None:
        """The group cannot step: every request in the batch ends failed with the reason (none is left hanging)."""
        await self._fail_requests([wire_id(r) for r in self.batcher.running_ids], reason)

    async def _fail_requests(self, request_ids: list[int], reason: str) -> None:
        """These running requests end failed with the reason (none is left hanging)."""
        for request_id in request_ids:
            self.batcher.cancel(request_id)
            await self._fail(request_id, reason)
        self.metrics.running.set(self.batcher.running)
        self.metrics.kv_reserved_tokens.set(self.batcher.reserved_tokens)

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
                **handoff_splits_body({rid: asdict(split) for rid, split in self.splits.by_request.items()})}

    def stats(self) -> dict:
        return {
            "role": "decode",
            "name": self.name,
            "steps": self.steps,
            "tokens": self.tokens,
            "gpu_energy_j": self.gpu_energy_j,
            "requests": dict(self.outcomes),
            "kv_handoffs": dict(self.handoffs),
            "cancelled": dict(self.cancelled),
            # The batch now: a withdrawn request's reservation is gone from it at once.
            "batch": {"waiting": self.batcher.waiting, "running": self.batcher.running,
                      "kv_reserved_tokens": self.batcher.reserved_tokens},
            "kv_content_mismatches": self.sample.kv_content_mismatches + (
                self.model_accuracy.raw_mismatches if self.model_accuracy is not None else 0),
            "failed_reasons": dict(self.failed_reasons),
            "link": self.link.stats(),
            "accuracy": {"codecs": sorted(self.codecs_seen), **self.sample.stats()},
            **({"accuracy_model": self.model_accuracy.stats()} if self.model_accuracy is not None else {}),
            "timer_lateness_p99_s": lateness_p99(self.lateness),
            "timer_lateness_mean_s": lateness_mean(self.lateness),
            "timer_wakeups": len(self.lateness),
            # What the holds wait on: "timerfd" (sub-ms, sleeping) or "loop" (ms timer + 1 ms spin).
            "timer": self.clock.timer,
            "timer_priority": timer_priority(self.clock),
            "handoff_phases_s": dict(self.phase_s),
            "handoff_split": dict(self.splits.totals),
            "streamed_handoff_model": self.splits.streamed_model_stats(),
            "shortest_step_wall_s": self.shortest_step_wall_s if self.steps else None,
            **({"tp_group": self.tp_steps.stats(self.group)} if self.tp_steps is not None else {}),
            **({"remote_kv": {"select": self.scenario.select_mode, **self.remote.record.to_json()}}
               if self.remote is not None else {}),
        }

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        if self.model_accuracy is not None:
            await self.model_accuracy.start()  # the model loads in its worker meanwhile; we are ready at once
        if self.group is not None:
            await self.group.start()  # its followers are up (the launcher started them first): a failure is fatal
        kv_server = await listen(self.listen_address, "--listen", self.serve_kv, Role.DECODE, Role.MIDDLEBOX)
        client_server = await listen(self.client_listen, "--client-listen", self.serve_client, Role.DECODE,
                                     Role.LOADGEN)
        http = await start_http(self.metrics_listen, self.registry, self.stats)
        http.route("GET", QUEUE_WAITS_PATH, self._queue_waits_route, public=True)
        remote_port = ({"remote_kv_port": await self.remote.listen(self.remote_kv_listen.host,
                                                                   self.remote_kv_listen.port)}
                       if self.remote is not None else {})
        announce_ready("decode", self.name, listen_port=kv_server.port, client_port=client_server.port,
                       metrics_port=http.port, **remote_port)
        loops = TaskSet("decode")
        step = loops.spawn(self.step_loop(), "step loop")
        stopper = loops.spawn(stop.wait(), "stop")
        try:
            done, _ = await asyncio.wait([step, stopper], return_when=asyncio.FIRST_COMPLETED)
            if step in done and (failure := step.exception()) is not None:
                raise failure
        finally:
            self._stopping = True  # from here no KV is acked (see model/serving/kv_arrival.py: stopping)
            await loops.close()
            await kv_server.shutdown(1.0)
            for client in list(self._clients):
                client.abort()
            await client_server.shutdown(1.0)
            await http.close()
            if self.group is not None:
                await self.group.close()
            if self.model_accuracy is not None:
                await self.model_accuracy.close()
            if self.remote is not None:
                await self.remote.close()


def _ack_status(decision: KvEndDecision) -> AckStatus:
    return AckStatus.OK if decision.ack_ok else AckStatus.FAILED
