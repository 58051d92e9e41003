"""The prefill agent: one prefill instance (docs/reference.md §4).

It takes Requests from the load generator, queues and batches them (`PrefillQueue`), holds each batch for
the roofline prefill time × dilation on absolute deadlines, sends each request's FirstToken at the end of its
step, then hands the request's KV (real bytes, per layer or ≤ 8 MiB piece of one) to `handoffs.HandoffLink`, which
streams it towards decode through the middlebox and keeps it until the Ack for that request comes back.

What a step holds and costs is planned by the pure `model.prefill_plan` (the roofline time from the cached and
computed tokens, the GPU codec with `compress_at="gpu"`, the energy); this file does the holding and the I/O.
The KV of a batch is generated (and, with `compress_at="gpu"`, encoded) layer by layer as the hand-off link
sends it, while the step's timer runs on an idle link, so the host's real work overlaps the modelled GPU time;
if it overruns, the step wakes late and the fidelity guard sees it.

Layer-wise streaming and chunked prefill (model/serving/layerwise.py): with `--handoff layerwise` each layer of a
request's KV is released as its compute ends within the step, and with `--prefill-chunk` a prompt is computed a chunk a
step (`model.prefill_plan.ChunkedPrefillQueue`), each chunk's KV released by its own step. The hand-off is staged with
the request's first chunk and each later chunk's step is added to its `ReleaseSchedule` as it is planned; the first
token still comes at the end of the request's last chunk.

The flows plug their parts in (agents/prefill/parts.py: `PrefillPart`): the tier's prefix cache looks a request's
prefix up before it is queued and writes back what its step computed; a TP group's leader or a ring's holds the steps
whose plan carries their flow (agents/stepping.py), and a part whose live step fails (`StepFailed`) fails the step's
requests with the reason while the others go on. The real model's KV (`--kv-sample real`) is a part of the core's.

A request the client withdraws (an Error naming it: its own client went away) is `cancel`led: queued, it leaves
the queue and is never computed; in a step, the step runs whole (a batch on the GPU is not taken apart) and its
hand-off is released, a stream going out aborted (handoffs.py).

Steps are held on the injected `clock` (a ManualClock in tests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from kvtransit.agents.common.request_ids import wire_id
from kvtransit.agents.plugins import flow_parts
from kvtransit.agents.prefill.handoffs import HandoffLink
from kvtransit.agents.prefill.parts import PrefillPart
from kvtransit.agents.prefill.real_kv import real_kv_parts
from kvtransit.agents.prefill.staging import HandoffStager
from kvtransit.agents.process import Address, new_registry, step_clock, timer_stats
from kvtransit.agents.skeleton import AgentContext
from kvtransit.agents.stepping import StepFailed, StepHolders, StepTiming
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import StepWindow
from kvtransit.model.serving.policies import ServingRequest
from kvtransit.model.serving.prefill_plan import (
    BatchEntry,
    PrefillChunk,
    PrefillStepPlan,
    batch_entry,
    plan_prefill_step,
    prefill_queue,
)
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock, DeadlineSchedule, wake_stamp_ns
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.errors import ErrorCode
from kvtransit.wire.events import Bye, Error, FirstToken, Hello, Request, Role
from kvtransit.wire.limits import WIRE_VERSION, clip_message

log = logging.getLogger(__name__)


@dataclass
class _Admitted:
    """A request taken from the load generator, until its step has run (then its hand-off is `handoffs`')."""

    request: Request
    client: Endpoint


class PrefillAgent:
    role = "prefill"

    def __init__(self, scenario: Scenario, *, name: str, listen: Address, kv_to: Address, metrics_listen: Address,
                 clock: Clock | None = None, flow_args: Mapping[str, Any] | None = None):
        """`clock`: what steps are held on (default: the monotonic clock, its wake-up lateness fed to the fidelity
        guard). `flow_args`: the flows' flags for this process by name (agents/plugins.py: a TP group's or a ring's
        followers to lead, the middlebox's pool port)."""
        self.scenario = scenario
        self.name = name
        self.listen_address, self.kv_to, self.metrics_listen = listen, kv_to, metrics_listen
        self.registry, shared = new_registry("prefill")
        self.metrics = runtime_metrics.prefill_metrics(self.registry)
        self.clock, self.lateness = step_clock(shared, "prefill", clock,
                                               lambda: self.shortest_step_wall_s if self.steps else None)
        self.handoffs = HandoffLink(name=name, kv_to=kv_to, clock=self.clock, metrics=self.metrics)
        self.queue = prefill_queue(scenario)
        self.admitted: dict[int, _Admitted] = {}  # request id → until its (last chunk's) step has run
        self._work = asyncio.Event()
        self.steps = 0
        self.shortest_step_wall_s = float("inf")
        self.cancelled = {"queued": 0, "handoff": 0}  # withdrawn by their client, by where they were
        self.gpu_energy_j = 0.0
        self.stager = HandoffStager(self)  # before the parts: the prefix cache part stages from its KV
        self.parts: list[PrefillPart] = [*real_kv_parts(self),
                                         *flow_parts("prefill", self, flow_args or {}, PrefillPart)]
        self.holders = StepHolders(self.clock, self.parts)

    # -- the loadgen side --------------------------------------------------------------------------------

    async def serve_client(self, endpoint: Endpoint) -> None:
        """One load generator's connection: say Hello, then admit every Request it sends until its Bye."""
        await endpoint.send(Hello(role=Role.PREFILL, version=WIRE_VERSION, name=self.name))
        while (event := await endpoint.next_event()) is not None:
            if isinstance(event, Request):
                self.admitted[event.request_id] = _Admitted(event, endpoint)
                if not any(part.admit(event, self._enqueue) for part in self.parts):
                    self._enqueue(event, 0)
            elif isinstance(event, Error) and event.request_id is not None:
                self.cancel(event.request_id, event.message)
            elif isinstance(event, Bye):
                break

    def _enqueue(self, request: Request, cached_tokens: int) -> None:
        """Queue a request (its cached prefix looked up): the batch budget counts only the tokens the step computes
        (the cached ones are re-read). A request withdrawn meanwhile is not queued."""
        if request.request_id not in self.admitted:
            return
        self.queue.push(ServingRequest(request.request_id, request.prompt_tokens - cached_tokens,
                                       request.output_tokens))
        self.metrics.queued_tokens.set(self.queue.queued_tokens)
        self._work.set()

    def cancel(self, request_id: int, reason: str) -> str:
        """Withdraw a request whose client went away (the module docstring); returns where it was: "queued" (or
        its prefix lookup still running), "handoff" (its KV held), or "" (done, or never here)."""
        where = ""
        if self.admitted.pop(request_id, None) is not None:
            # Not queued yet (its lookup is running: it is not queued after it) or queued: never computed. A
            # request whose earlier chunk is in the running step is queued too, for its next chunk.
            self._drop(request_id)
            where = "queued"
        if self.handoffs.cancel(request_id, reason):  # staged by its first chunk's step, or its whole step
            where = "handoff"
        if where:
            self.cancelled[where] += 1
            log.info("request %d withdrawn by its client (%s): %s", request_id, where, reason)
        return where

    def _drop(self, request_id: int) -> None:
        """A request leaves before its (last) step has run: out of the queue, the stager and every part."""
        self.queue.cancel(request_id)
        self.metrics.queued_tokens.set(self.queue.queued_tokens)
        self.stager.forget(request_id)
        for part in self.parts:
            part.forget(request_id)

    # -- the step loop -----------------------------------------------------------------------------------

    def cached_tokens(self, request_id: int) -> int:
        return sum(part.cached_tokens(request_id) for part in self.parts)

    def _batch_entry(self, item: ServingRequest | PrefillChunk) -> BatchEntry:
        """The step's view of a queued request (or of one chunk of it): its context before and after the step."""
        request_id = wire_id((item.request if isinstance(item, PrefillChunk) else item).request_id)
        output_tokens = self.admitted[request_id].request.output_tokens
        return batch_entry(item, request_id, self.cached_tokens(request_id), output_tokens)

    async def step_loop(self) -> None:
        """Take a batch, hold it for its planned time on the clock, send its first tokens; idle when none is queued."""
        schedule: DeadlineSchedule | None = None  # None: idle, the next step starts now
        while True:
            if not len(self.queue):
                schedule = None
                self._work.clear()
                await self._work.wait()
                continue
            batch = self.queue.take_batch()
            self.metrics.queued_tokens.set(self.queue.queued_tokens)
            plan = plan_prefill_step(self.scenario, [self._batch_entry(item) for item in batch])
            # Back-to-back steps chain on deadlines (step k due at t0 + Σ durations, so a late wake-up is not
            # carried into the next step); after idling, from now.
            schedule = schedule or DeadlineSchedule(self.clock)
            fresh_start_ns = schedule.start_ns if schedule.steps == 0 else None
            start_ns = schedule.deadline_ns
            deadline_ns = schedule.add(plan.wall_s)
            window = StepWindow(start_ns, deadline_ns - start_ns)
            # In the step now: from here on the step's own table holds the ones it finishes (and the hand-offs,
            # `handoffs`); a request with chunks still to run stays admitted.
            step = {e.request_id: (self.admitted.pop(wire_id(e.request_id)) if e.last_chunk
                                   else self.admitted[wire_id(e.request_id)]) for e in plan.entries}
            for entry in plan.handoffs:  # the link makes and sends their KV while the step's timer runs
                admitted = step[entry.request_id]
                self.stager.step_handoff(admitted.request, admitted.client, entry, window)
            # The step ends when its timer wakes: that instant, not a later read of the clock, stamps its first
            # tokens (wake_stamp_ns says why). A flow's step (a TP group's, a ring's) is its part's to hold.
            timing = StepTiming(start_ns, deadline_ns, start_ns + round(self.scenario.wall_s(plan.compute_s) * 1e9),
                                fresh_start_ns)
            try:
                held = await self.holders.hold(plan, timing)
            except StepFailed as exc:
                await self._fail_step(plan, step, str(exc))
                schedule = None
                continue
            if held.restart:  # the next step starts when this one ended, as measured (not at its model end)
                schedule = None
            t_ns = wake_stamp_ns(deadline_ns, held.late_ns)
            self.steps += 1
            self.shortest_step_wall_s = min(self.shortest_step_wall_s, plan.wall_s)
            self.metrics.step_seconds.observe(plan.model_s)
            self.gpu_energy_j += plan.energy_j
            self.metrics.gpu_energy_joules.inc(plan.energy_j)
            finished = [entry for entry in plan.entries if entry.last_chunk]
            for entry in finished:  # what this step computed is the parts' now (the tier writes it back)
                for part in self.parts:
                    part.step_ran(wire_id(entry.request_id))
            for entry in finished:
                await self._first_token(step[entry.request_id], t_ns)
                if not entry.hands_off:  # nothing to decode: done at prefill (as in the simulator)
                    self.metrics.requests.labels(outcome="ok").inc()

    async def _fail_step(self, plan: PrefillStepPlan, step: dict[Hashable, _Admitted], reason: str) -> None:
        """A flow's live part of the step failed: none of its requests gets a first token; each one's hand-off
        (staged as the step began) is released and aborted downstream, its later chunks unqueued, and its client
        told why."""
        for entry in plan.entries:
            rid = wire_id(entry.request_id)
            self.handoffs.cancel(rid, reason)
            self.admitted.pop(rid, None)
            self._drop(rid)
            try:
                await step[entry.request_id].client.send(Error(code=ErrorCode.REQUEST_FAILED,
                                                               message=clip_message(reason), request_id=rid))
            except (ConnectionError, RuntimeError) as exc:
                log.warning("could not tell the client request %d failed: %s", rid, exc)

    async def _first_token(self, admitted: _Admitted, t_ns: int) -> None:
        try:
            await admitted.client.send(FirstToken(request_id=admitted.request.request_id, t_ns=t_ns))
        except (ConnectionError, RuntimeError) as exc:
            log.warning("could not send first token of request %d: %s", admitted.request.request_id, exc)

    # -- stats and lifecycle (agents/skeleton.py: serve) ---------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "role": "prefill",
            "name": self.name,
            "steps": self.steps,
            "gpu_energy_j": self.gpu_energy_j,
            **self.handoffs.stats(),
            "cancelled": dict(self.cancelled),
            **timer_stats(self.clock, self.lateness),
            "shortest_step_wall_s": self.shortest_step_wall_s if self.steps else None,
            "host_kv_s": self.handoffs.make_s,
        }

    async def start(self, ctx: AgentContext) -> None:
        await self.handoffs.connect()
        ctx.on_close(self.handoffs.close)
        await ctx.listen(self.listen_address, "--listen", self.serve_client, Role.PREFILL, Role.LOADGEN,
                         port_key="listen_port")

    def main_loops(self) -> dict[str, Any]:
        return {"step loop": self.step_loop(), "hand-offs": self.handoffs.run()}

    async def stopping(self) -> None:
        pass
