"""The twin's run: a scenario's requests through prefill, the hand-off link and decode on a virtual clock.

Each decision is the one the live agents make, by the same function (the module that decides, then the agent that
calls it):

- **arrivals**: `workload/source.py: requests_for`, the load generator's requests, in its order (the same seed);
- **prefill routing**: `PrefillRouter` (agents/loadgen/agent.py): fewest queued prompt tokens, counted until the first
  token comes back;
- **prefill batching and step holds**: `prefill_queue` and `plan_prefill_step` (model/serving/prefill_plan.py;
  agents/prefill/agent.py): back-to-back steps chain, a step after an idle spell starts when its first request
  arrives; a flow that plans a step (a ring request's, a TP group's with its collectives) plans it here too;
- **release to the link**: `release_ns` (model/serving/layerwise.py): whole at the first token, layer-wise as each
  layer's compute ends, chunked prefill by each chunk's step;
- **the link**: twin/link.py (the fidelity guard's prescribed terms, FIFO lanes);
- **decode routing**: `least_loaded` over hand-offs not yet acked (agents/middlebox/decode_peers.py: `pick`), chosen
  when the hand-off takes the link and acked when it is all at decode;
- **decode arrival**: `KvArrivals.end` (model/serving/kv_arrival.py): accepted, or refused as never fitting;
- **decode admission and steps**: `DecodeBatcher` and `plan_decode_step` (model/serving/decode_plan.py;
  agents/decode/agent.py): admission at a step boundary, a step after idling starting when its KV arrives.

What the twin leaves out, because the live system's departures from the model are what it is there to show: timer
lateness, the host's work, TCP, the shaper's granularity, faults. A hand-off is booked on the link at its first part's
release, or, with chunked prefill, when its last chunk's step is planned (its parts are known then); the live link
interleaves the parts of hand-offs in flight at once, the twin keeps each hand-off's parts together on its lane.

Every time is in model seconds from the run's start (the first request's arrival reference, as the load generator's
`t0`); every byte at full size: the twin has no scale and no dilation.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvtransit.model.cost.energy import handoff_module_energy_j, link_energy_j
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.module.budget import Action
from kvtransit.model.scenario import Scenario
from kvtransit.model.sections import PrefixCache
from kvtransit.model.serving.decode_plan import DecodeStepPlan, plan_decode_step
from kvtransit.model.serving.kv_arrival import KvArrivals, Verdict
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE
from kvtransit.model.serving.policies import (
    DecodeBatcher,
    PrefillQueue,
    PrefillRouter,
    ServingRequest,
    least_loaded,
)
from kvtransit.model.serving.prefill_plan import (
    BatchEntry,
    ChunkedPrefillQueue,
    PrefillChunk,
    PrefillStepPlan,
    batch_entry,
    plan_prefill_step,
    prefill_queue,
)
from kvtransit.model.serving.workload import RequestSpec
from kvtransit.twin.events import EventQueue
from kvtransit.twin.link import Crossing, Lanes, Part, WireSizer
from kvtransit.workload.source import new_record, requests_for

SOURCE = "twin"


def _rid(request_id: Hashable) -> int:
    """A request's id as the twin keys it: the load generator's integer ids (the serving policies take any key)."""
    if not isinstance(request_id, int):
        raise TypeError(f"twin: request id {request_id!r} is not an int")
    return request_id


def _prefix_cache(scenario: Scenario) -> PrefixCache | None:
    """A prefill instance's own prefix cache, from the flow that keeps one (None: no prefix reuse at the prefill)."""
    return next((cache for s in scenario.enabled_sections if (cache := s.prefix_cache(scenario)) is not None), None)


def unmodelled_flows(scenario: Scenario) -> list[str]:
    """The enabled flows the twin has no model for (model/sections.py: `Section.twin_gap`), each as "name: why"."""
    return [f"{s.FLOW}: {why}" for s in scenario.enabled_sections if (why := s.twin_gap(scenario)) is not None]


def check_twin(scenario: Scenario) -> None:
    """Refuse a scenario the twin cannot model, naming the flow (never approximate it silently)."""
    gaps = unmodelled_flows(scenario)
    if gaps:
        raise ConfigError("twin: no model yet for flow " + "; ".join(gaps))


@dataclass
class Stages:
    """One request's stamps at each stage, model seconds (None where it never got there)."""

    prefill: int = -1
    step_start_s: float | None = None  # its (last chunk's) prefill step
    step_s: float | None = None  # that step's length
    link_start_s: float | None = None  # its first byte on its lane
    link_occupancy_s: float | None = None
    lane: int | None = None
    decode: int | None = None
    admitted_s: float | None = None


@dataclass
class StepTotals:
    """One role's steps over the run: how many, and their model seconds in all and of them the TP group's
    collectives (0 without a group), so the twin reports the step split a live TP group's leader reports."""

    steps: int = 0
    model_s: float = 0.0
    collective_s: float = 0.0

    def add(self, model_s: float, collective_s: float) -> None:
        self.steps += 1
        self.model_s += model_s
        self.collective_s += collective_s


@dataclass
class TwinRun:
    """What the twin recorded: the client's records (as the load generator keeps them), every request's stages, and
    the instances' and the link's totals."""

    scenario: Scenario
    specs: list[RequestSpec]  # the requests it ran, as the load generator would send them
    records: list[RequestRecord]
    stages: dict[int, Stages]
    run_s: float
    events: int
    prefill_steps: list[int]
    decode_steps: list[int]
    gpu_energy_j: float
    link_busy_s: float
    kv_bytes: float
    wire_bytes: float
    module_energy_j: float
    link_energy_j: float
    step_totals: dict[str, StepTotals] = field(default_factory=dict)  # by role: "prefill", "decode"
    # Prompt tokens each request's prefix lookup found cached (None: no prefill keeps a prefix cache).
    cached_tokens: dict[int, int] | None = None

    @property
    def tokens_delivered(self) -> int:
        return sum(len(r.token_times_s) for r in self.records)


@dataclass
class _Prefill:
    index: int
    queue: PrefillQueue | ChunkedPrefillQueue
    prefix: PrefixCache | None = None  # its own prefix cache (a flow's: model/sections.py `prefix_cache`)
    busy: bool = False
    steps: int = 0


@dataclass
class _Decode:
    index: int
    batcher: DecodeBatcher
    busy: bool = False
    steps: int = 0
    unacked: int = 0
    admitted_prompts: list[int] = field(default_factory=list)
    ready_s: dict[Hashable, float] = field(default_factory=dict)


class _Twin:
    def __init__(self, scenario: Scenario, specs: list[RequestSpec]) -> None:
        self.scenario = scenario
        self.specs = specs
        self.spec_of = {spec.request_id: spec for spec in specs}
        self.events = EventQueue()
        self.router = PrefillRouter(scenario.prefill)
        self.prefills = [_Prefill(i, prefill_queue(scenario), _prefix_cache(scenario)) for i in range(scenario.prefill)]
        self.cached: dict[int, int] = {}  # request id -> prompt tokens its prefix lookup found cached
        self.decodes = [_Decode(i, DecodeBatcher(scenario.decode_kv_capacity_tokens)) for i in range(scenario.decode)]
        self.arrivals = [KvArrivals(0) for _ in self.decodes]
        self.lanes = Lanes(scenario)
        self.sizer = WireSizer(scenario)
        self.layers = scenario.model_spec.layers
        self.records: dict[int, RequestRecord] = {}
        self.stages: dict[int, Stages] = {}
        self.parts: dict[int, list[Part]] = {}  # a streamed hand-off's parts, chunk by chunk
        self.gpu_energy_j = 0.0
        self.step_totals = {"prefill": StepTotals(), "decode": StepTotals()}
        self.kv_bytes = 0.0
        self.wire_bytes = 0.0
        self.module_energy_j = 0.0
        self.in_flight = 0
        self.waiting: deque[RequestSpec] = deque()
        self.in_transit = (scenario.module_verdict is not None
                           and scenario.module_verdict.action is Action.IN_TRANSIT)

    # -- arrivals and prefill ------------------------------------------------------------------------------

    def run(self) -> None:
        for spec in self.specs:
            self.events.at(spec.arrival_s, functools.partial(self._arrive, spec))
        self.events.run()

    def _arrive(self, spec: RequestSpec) -> None:
        """A request's arrival: sent now, or, with `max_concurrency` and every slot taken, when one frees (the load
        generator's slots: its record's arrival is when it was sent, agents/loadgen/agent.py `send_request`)."""
        if self.scenario.max_concurrency and self.in_flight >= self.scenario.max_concurrency:
            self.waiting.append(spec)
            return
        self._send(spec)

    def _ended(self) -> None:
        """A request ended (its last token, done at prefill, or failed): its slot goes to the next one waiting."""
        self.in_flight -= 1
        if self.waiting:
            self._send(self.waiting.popleft())

    def _send(self, spec: RequestSpec) -> None:
        self.in_flight += 1
        request = ServingRequest(spec.request_id, spec.prompt_tokens, spec.output_tokens)
        prefill = self.prefills[self.router.assign(request)]
        self.records[spec.request_id] = new_record(self.scenario, spec, self.events.now_s)
        self.stages[spec.request_id] = Stages(prefill=prefill.index)
        # Looked up before it queues, as the prefill's tier part does (agents/prefill/agent.py `_enqueue`): what is
        # queued is the prompt less its cached prefix.
        cached = self.cached[spec.request_id] = prefill.prefix.lookup(spec) if prefill.prefix is not None else 0
        prefill.queue.push(ServingRequest(spec.request_id, spec.prompt_tokens - cached, spec.output_tokens))
        if not prefill.busy:
            self._prefill_step(prefill)

    def _prefill_step(self, prefill: _Prefill) -> None:
        batch: Sequence[ServingRequest | PrefillChunk] = prefill.queue.take_batch()
        if not batch:
            prefill.busy = False
            return
        entries = [self._entry(item) for item in batch]
        plan = plan_prefill_step(self.scenario, entries)
        start = self.events.now_s
        prefill.busy = True
        for entry in plan.handoffs:
            self._release(entry, start, plan.model_s)
        self.events.at(start + plan.model_s, lambda: self._prefill_done(prefill, plan, start))

    def _entry(self, item: ServingRequest | PrefillChunk) -> BatchEntry:
        rid = _rid((item.request if isinstance(item, PrefillChunk) else item).request_id)
        return batch_entry(item, rid, self.cached[rid], self.records[rid].output_tokens)

    def _prefill_done(self, prefill: _Prefill, plan: PrefillStepPlan, start_s: float) -> None:
        now = self.events.now_s
        prefill.steps += 1
        self.step_totals["prefill"].add(plan.model_s, plan.collective_s)
        self.gpu_energy_j += plan.energy_j
        for entry in plan.entries:
            if not entry.last_chunk:
                continue
            rid = _rid(entry.request_id)
            if prefill.prefix is not None:  # what the step computed is the cache's now (the write-back)
                prefill.prefix.computed(self.spec_of[rid])
            record = self.records[rid]
            record.token_times_s.append(now)
            record.first_token_stamp_s = now
            self.stages[rid].step_start_s, self.stages[rid].step_s = start_s, plan.model_s
            self.router.complete(rid)
            if not entry.hands_off:  # nothing to decode: done at its first token (as in the simulator)
                self._ended()
        self._prefill_step(prefill)

    # -- the link ------------------------------------------------------------------------------------------

    def _release(self, entry: BatchEntry, start_s: float, step_s: float) -> None:
        """The parts of `entry`'s KV this step releases (model/serving/layerwise.py's schedule), booked on the link at
        the first part's release once all of the hand-off's parts are known (its last chunk's step)."""
        rid = _rid(entry.request_id)
        model = self.scenario.model_spec
        kv = float(model.kv_bytes(entry.kv_tokens))
        wire = self.sizer.wire_bytes(kv, entry.kv_tokens)
        if self.scenario.handoff == HANDOFF_LAYERWISE:
            layer_kv, layer_wire = kv / self.layers, wire / self.layers
            parts = [Part(start_s + (layer + 1) * step_s / self.layers, layer_kv, layer_wire)
                     for layer in range(self.layers)]
        else:
            parts = [Part(start_s + step_s, kv, wire)]
        self.parts.setdefault(rid, []).extend(parts)
        if entry.last_chunk:
            parts = self.parts.pop(rid)
            book_at = max(self.events.now_s, parts[0].released_s)
            self.events.at(book_at, lambda: self._cross(rid, parts))

    def _cross(self, rid: int, parts: list[Part]) -> None:
        crossing = self.lanes.cross(parts)
        kv = sum(p.kv_bytes for p in parts)
        wire = sum(p.wire_bytes for p in parts)
        self.kv_bytes += kv
        self.wire_bytes += wire
        if self.in_transit:
            self.module_energy_j += handoff_module_energy_j(self.scenario.module, kv, wire)
        decode = self.decodes[least_loaded([d.unacked for d in self.decodes])]
        decode.unacked += 1
        stages = self.stages[rid]
        stages.link_start_s, stages.link_occupancy_s = crossing.start_s, crossing.occupancy_s
        stages.lane = crossing.lane
        stages.decode = decode.index
        self.events.at(crossing.ready_s, lambda: self._kv_ready(rid, decode, crossing))

    # -- decode --------------------------------------------------------------------------------------------

    def _kv_ready(self, rid: int, decode: _Decode, crossing: Crossing) -> None:
        decode.unacked -= 1
        record = self.records[rid]
        record.kv_ready_s = self.events.now_s
        request = ServingRequest(rid, record.prompt_tokens, record.output_tokens)
        verdict = self.arrivals[decode.index].end(request, decode.batcher, began_duplicate=False, stopping=False,
                                                  has_clients=True)
        if verdict.verdict is not Verdict.ACCEPT:
            record.failure = verdict.client_reason or verdict.reason
            self._ended()
            return
        decode.ready_s[rid] = self.events.now_s
        decode.batcher.enqueue(request)
        if not decode.busy:
            self._decode_step(decode)

    def _decode_step(self, decode: _Decode) -> None:
        now = self.events.now_s
        batcher = decode.batcher
        for request in batcher.admit():
            rid = _rid(request.request_id)
            decode.admitted_prompts.append(request.prompt_tokens)
            self.stages[rid].admitted_s = now
            self.records[rid].decode_wait_s = now - decode.ready_s.pop(rid)
        if not batcher.running:
            decode.busy = False
            return
        decode.busy = True
        plan = plan_decode_step(self.scenario, batcher.running, batcher.context_tokens, decode.admitted_prompts)
        decode.admitted_prompts = []
        self.events.at(now + plan.model_s, lambda: self._decode_done(decode, plan))

    def _decode_done(self, decode: _Decode, plan: DecodeStepPlan) -> None:
        now = self.events.now_s
        decode.steps += 1
        self.step_totals["decode"].add(plan.model_s, plan.collective_s)
        self.gpu_energy_j += plan.energy_j
        result = decode.batcher.step()
        for rid, _index in result.tokens:
            self.records[_rid(rid)].token_times_s.append(now)
        for _ in result.finished:
            self._ended()
        self._decode_step(decode)


def run_twin(scenario: Scenario) -> TwinRun:
    """Run `scenario` on the twin (refused, naming the flow, when a flow it enables has no model yet)."""
    check_twin(scenario)
    twin = _Twin(scenario, requests_for(scenario))
    twin.run()
    records = [twin.records[spec.request_id] for spec in twin.specs]
    run_s = twin.events.now_s
    return TwinRun(
        scenario=scenario, specs=twin.specs, records=records, stages=twin.stages, run_s=run_s,
        events=twin.events.events_run,
        prefill_steps=[p.steps for p in twin.prefills], decode_steps=[d.steps for d in twin.decodes],
        gpu_energy_j=twin.gpu_energy_j, link_busy_s=twin.lanes.busy_s, kv_bytes=twin.kv_bytes,
        wire_bytes=twin.wire_bytes, module_energy_j=twin.module_energy_j,
        link_energy_j=link_energy_j(scenario.link_spec, twin.wire_bytes), step_totals=twin.step_totals,
        cached_tokens=dict(twin.cached) if any(p.prefix is not None for p in twin.prefills) else None,
    )
