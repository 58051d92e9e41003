"""The decode agent: one decode instance (docs/reference.md §4).

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

Beside this loop, one module per job: `ingress.py` (the KV link: each hand-off reassembled, decided on and answered),
`incoming.py` (a hand-off being reassembled), `link_meter.py` (the link's bytes and busy time at the receiving end),
`handoff_splits.py` (each hand-off split at its first token, streamed ones held against the model),
`accuracy_sample.py` (the codec's measured error on the first `accuracy_sample` requests, with the equal-bytes
baseline's on the same tensors). The flows plug their parts in (agents/decode/parts.py: `DecodePart`): selection's
remote-KV legs run before a step's compute; a TP group's leader holds the steps whose plan carries its collectives
(agents/stepping.py); a part whose live step fails (`StepFailed`) fails the requests it names with the reason. The
real model reading the KV that arrived (`--kv-sample real`) is a part of the core's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from kvtransit.agents.common.queue_waits import QUEUE_WAITS_PATH, QueueWaits, handoff_splits_body, queue_waits_body
from kvtransit.agents.common.request_ids import wire_id
from kvtransit.agents.decode.accuracy_sample import AccuracySample
from kvtransit.agents.decode.handoff_splits import HandoffSplits
from kvtransit.agents.decode.ingress import KvIngress
from kvtransit.agents.decode.link_meter import LinkMeter
from kvtransit.agents.decode.model_accuracy import model_accuracy_parts
from kvtransit.agents.decode.parts import DecodePart
from kvtransit.agents.plugins import flow_parts
from kvtransit.agents.process import Address, new_registry, step_clock, timer_stats
from kvtransit.agents.skeleton import AgentContext
from kvtransit.agents.stepping import StepFailed, StepHolders, StepTiming
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.decode_plan import plan_decode_step
from kvtransit.model.serving.kv_arrival import KNOWN_REQUESTS, KvArrivals
from kvtransit.model.serving.policies import DecodeBatcher, ServingRequest
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock, DeadlineSchedule, wake_stamp_ns
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.errors import ErrorCode
from kvtransit.wire.events import Bye, Error, Hello, Role, TokenEntry, Tokens
from kvtransit.wire.limits import MAX_META, WIRE_VERSION

log = logging.getLogger(__name__)

# A Tokens frame carries 20 B per entry in a 64 KiB meta block (wire/limits.py): split larger steps.
TOKENS_PER_FRAME = MAX_META // 32


class DecodeAgent:
    role = "decode"

    def __init__(self, scenario: Scenario, *, name: str, listen: Address, client_listen: Address,
                 metrics_listen: Address, accuracy_sample: int = 8, link_backend: str = "userspace",
                 clock: Clock | None = None, flow_args: Mapping[str, Any] | None = None):
        """`link_backend` "tc": the kernel shapes the link's rate, so the middlebox cannot see what crossed it;
        this receiving end then exports the link's achieved rate (model units) from its own measurement.
        `clock`: what steps are held on (default: the monotonic clock, its lateness fed to the fidelity guard).
        `flow_args`: the flows' flags for this process by name (agents/plugins.py: a TP group's followers to lead,
        where selection's remote legs listen)."""
        self.scenario = scenario
        self.name = name
        self.listen_address, self.client_listen, self.metrics_listen = listen, client_listen, metrics_listen
        self.registry, shared = new_registry("decode")
        self.metrics = runtime_metrics.decode_metrics(self.registry)
        self.clock, self.lateness = step_clock(shared, "decode", clock,
                                               lambda: self.shortest_step_wall_s if self.steps else None)
        self.batcher = DecodeBatcher(scenario.decode_kv_capacity_tokens)
        self.link = LinkMeter()
        self._clients: set[Endpoint] = set()
        self._work = asyncio.Event()
        # The shaped link's latency (and the module's), wall ns: a streamed chunk's bytes cannot be here sooner.
        self.latency_ns = round((scenario.scaled_link.latency_s
                                 + scenario.module.added_latency_s * scenario.effective_dilation) * 1e9)
        if link_backend == "tc":
            model_per_wall = scenario.effective_dilation / scenario.effective_scale
            runtime_metrics.link_achieved_rate_gauge(self.registry).labels(link=scenario.link).set_function(
                lambda: self.link.achieved_Bps * model_per_wall)
        self.sample = AccuracySample(scenario, accuracy_sample, self.metrics.codec_relative_error)
        self.steps = 0
        self.tokens_made = 0
        self.shortest_step_wall_s = float("inf")
        self.gpu_energy_j = 0.0
        self.outcomes = {"ok": 0, "failed": 0}
        self.failed_reasons: dict[str, int] = {}
        self.is_stopping = False
        self.arrivals = KvArrivals(accuracy_sample)  # which hand-offs were taken (dedup), the accuracy sample
        # Withdrawn by their client: by where each was (in the batch, or its KV not here yet: with several decodes
        # the client tells each, as it cannot know which one the KV goes to), and the ids of the latter, whose KV is
        # dropped when it comes (bounded as KvArrivals' memory is, oldest forgotten first).
        self.cancelled = {"batch": 0, "before_kv": 0}
        self.withdrawn: OrderedDict[int, str] = OrderedDict()
        # Each request's wait in decode's queue, KV ready → admitted (served at QUEUE_WAITS_PATH for the client).
        self.queue_waits = QueueWaits()
        # The hand-off split at its first token (model seconds, bytes at scale): sums, each request's, and the
        # streamed ones against the model.
        self.splits = HandoffSplits(scenario, self.metrics)
        self.parts: list[DecodePart] = [self.sample, *model_accuracy_parts(self),
                                        *flow_parts("decode", self, flow_args or {}, DecodePart)]
        self.holders = StepHolders(self.clock, self.parts)
        self.ingress = KvIngress(self)

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

    @property
    def has_clients(self) -> bool:
        return bool(self._clients)

    def cancel(self, request_id: int, reason: str) -> None:
        """The client withdrew the request (module docstring): no token is made for it from the next step on."""
        if self.batcher.cancel(request_id):
            self.cancelled["batch"] += 1
            self._batch_gauges()
        elif request_id not in self.arrivals:  # its KV is not here yet (or never comes: dropped at prefill)
            self.cancelled["before_kv"] += 1
            self.withdrawn[request_id] = reason or "cancelled by its client"
            while len(self.withdrawn) > KNOWN_REQUESTS:
                self.withdrawn.popitem(last=False)

    async def _to_clients(self, event) -> None:
        for client in list(self._clients):
            try:
                await client.send(event)
            except (ConnectionError, RuntimeError) as exc:
                log.warning("dropping load generator %s: %s", client.peername, exc)
                self._clients.discard(client)

    async def tokens(self, entries: list[TokenEntry]) -> None:
        for start in range(0, len(entries), TOKENS_PER_FRAME):
            await self._to_clients(Tokens(entries=tuple(entries[start:start + TOKENS_PER_FRAME])))

    async def fail(self, request_id: int, reason: str) -> None:
        self.outcomes["failed"] += 1
        self.failed_reasons[reason] = self.failed_reasons.get(reason, 0) + 1
        self.metrics.requests.labels(outcome="failed").inc()
        await self._to_clients(Error(code=ErrorCode.REQUEST_FAILED, message=reason, request_id=request_id))

    def enqueue(self, request: ServingRequest, ready_ns: int) -> None:
        """A hand-off taken and acked (agents/decode/ingress.py): into the queue for the next step boundary."""
        self.queue_waits.ready(wire_id(request.request_id), ready_ns)
        self.batcher.enqueue(request)
        self.metrics.waiting.set(self.batcher.waiting)
        self._work.set()

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
            self._batch_gauges()
            if not self.batcher.running:
                schedule = None
                self._work.clear()
                await self._work.wait()
                continue
            running = [wire_id(r) for r in self.batcher.running_ids]
            context_tokens = self.batcher.context_tokens + sum(p.extra_context(running) for p in self.parts)
            plan = plan_decode_step(scenario, self.batcher.running, context_tokens, admitted_prompts)
            admitted_prompts.clear()
            # Back-to-back steps start at the previous deadline, not at the (late) wake-up: step k is due at
            # t0 + Σ durations, so timer lateness never accumulates into TPOT (ARCHITECTURE.md, time and scale).
            schedule = schedule or DeadlineSchedule(self.clock)
            fresh_start_ns = schedule.start_ns if schedule.steps == 0 else None
            try:
                for part in self.parts:  # what the step reads from elsewhere (remote KV), before its compute
                    await part.before_step(self.steps, running, schedule)
                start_ns = schedule.deadline_ns
                end_ns = schedule.add(plan.wall_s)
                held = await self.holders.hold(plan, StepTiming(
                    start_ns, end_ns, start_ns + round(scenario.wall_s(plan.compute_s) * 1e9), fresh_start_ns))
            except StepFailed as exc:
                await self._fail_requests(running if exc.request_ids is None else exc.request_ids, str(exc))
                schedule = None
                continue
            t_ns = wake_stamp_ns(end_ns, held.late_ns)  # its tokens' stamp (wake_stamp_ns says why)
            result = self.batcher.step()
            self.steps += 1
            self.tokens_made += len(result.tokens)
            self.shortest_step_wall_s = min(self.shortest_step_wall_s, plan.wall_s)
            self.metrics.step_seconds.observe(plan.model_s)
            self.metrics.tokens.inc(len(result.tokens))
            self.gpu_energy_j += plan.energy_j
            self.metrics.gpu_energy_joules.inc(plan.energy_j)
            for _ in result.finished:
                self.outcomes["ok"] += 1
                self.metrics.requests.labels(outcome="ok").inc()
            await self.tokens([TokenEntry(request_id=wire_id(rid), token_index=index, t_ns=t_ns)
                               for rid, index in result.tokens])

    async def _fail_requests(self, request_ids: list[int], reason: str) -> None:
        """These running requests end failed with the reason (none is left hanging)."""
        for request_id in request_ids:
            self.batcher.cancel(request_id)
            await self.fail(request_id, reason)
        self._batch_gauges()

    def _batch_gauges(self) -> None:
        self.metrics.waiting.set(self.batcher.waiting)
        self.metrics.running.set(self.batcher.running)
        self.metrics.kv_reserved_tokens.set(self.batcher.reserved_tokens)

    def _admitted(self, requests: list[ServingRequest]) -> None:
        """Each admitted request's queue wait, KV ready → now (the step boundary that admitted it), model seconds."""
        now = self.clock.now_ns()
        for request in requests:
            wait_s = self.queue_waits.admitted(wire_id(request.request_id), now, self.scenario.model_s)
            if wait_s is not None:
                self.metrics.queue_wait_seconds.observe(wait_s)

    # -- stats and lifecycle (agents/skeleton.py: serve) ---------------------------------------------------------

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
            "tokens": self.tokens_made,
            "gpu_energy_j": self.gpu_energy_j,
            "requests": dict(self.outcomes),
            **self.ingress.stats(),
            "cancelled": dict(self.cancelled),
            # The batch now: a withdrawn request's reservation is gone from it at once.
            "batch": {"waiting": self.batcher.waiting, "running": self.batcher.running,
                      "kv_reserved_tokens": self.batcher.reserved_tokens},
            "kv_content_mismatches": sum(p.kv_content_mismatches() for p in self.parts),
            "failed_reasons": dict(self.failed_reasons),
            "link": self.link.stats(),
            "accuracy": {"codecs": sorted(self.ingress.codecs_seen), **self.sample.stats()},
            **timer_stats(self.clock, self.lateness),
            "handoff_split": dict(self.splits.totals),
            "streamed_handoff_model": self.splits.streamed_model_stats(),
            "shortest_step_wall_s": self.shortest_step_wall_s if self.steps else None,
        }

    async def start(self, ctx: AgentContext) -> None:
        await ctx.listen(self.listen_address, "--listen", self.ingress.serve_kv, Role.DECODE, Role.MIDDLEBOX,
                         port_key="listen_port")
        await ctx.listen(self.client_listen, "--client-listen", self.serve_client, Role.DECODE, Role.LOADGEN,
                         port_key="client_port")
        ctx.on_close(self._abort_clients)  # before the client server shuts down (it is unwound after this)
        ctx.http.route("GET", QUEUE_WAITS_PATH, self._queue_waits_route, public=True)

    async def _abort_clients(self) -> None:
        for client in list(self._clients):
            client.abort()

    def main_loops(self) -> dict[str, Any]:
        return {"step loop": self.step_loop()}

    async def stopping(self) -> None:
        self.is_stopping = True  # from here no KV is acked (see model/serving/kv_arrival.py: stopping)
