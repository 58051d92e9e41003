"""The prefill agent: one prefill instance (REFERENCE §4).

It takes Requests from the load generator, queues and batches them (`PrefillQueue`), holds each batch for
the roofline prefill time × dilation on absolute deadlines, sends each request's FirstToken at the end of its
step, then hands the request's KV (real bytes, per layer or ≤ 8 MiB piece of one) to `handoffs.HandoffLink`, which
streams it towards decode through the middlebox and keeps it until the Ack for that request comes back.

What a step holds and costs is planned by the pure `model.prefill_plan` (the roofline time from the cached and
computed tokens, the GPU codec with `compress_at="gpu"`, the energy); this file does the holding and the I/O.
The KV of a batch is generated (and, with `compress_at="gpu"`, encoded) layer by layer as the hand-off link
sends it, while the step's timer runs on an idle link, so the host's real work overlaps the modelled GPU time;
if it overruns, the step wakes late and the fidelity guard sees it.

Layer-wise streaming and chunked prefill (issue 20, model/serving/layerwise.py): with `--handoff layerwise` each layer
of a request's KV is released as its compute ends within the step, and with `--prefill-chunk` a prompt is computed a
chunk a step (`model.prefill_plan.ChunkedPrefillQueue`), each chunk's KV released by its own step. The hand-off is
staged with the request's first chunk and each later chunk's step is added to its `ReleaseSchedule` as it is planned;
the first token still comes at the end of the request's last chunk.

A ring request (`--ring-share`, flows/ring/ring_class.py) runs in a step of its own: the rest of its prompt is held,
then its attention runs round the ring this prefill leads as rank 0 (`--ring-group`, flows/ring/group.py), every
hop real bytes over the shaped ring link; its first token comes when the ring is done, measured, and its hand-off
is staged as any other's. A ring that fails fails its request, and every later ring request, with the reason; the
other requests go on.

A request the client withdraws (an Error naming it: its own client went away) is `cancel`led: queued, it leaves
the queue and is never computed; in a step, the step runs whole (a batch on the GPU is not taken apart) and its
hand-off is released, a stream going out aborted (handoffs.py).

Steps are held on the injected `clock` (a ManualClock in tests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from kvtransit.agents.common import kv_frames
from kvtransit.agents.common.request_ids import wire_id
from kvtransit.agents.prefill.handoff_frames import HandoffFrames, KvSource
from kvtransit.agents.prefill.handoffs import HANDOFF_DEADLINE_S, HandoffLink, HeldHandoff, ReleaseSchedule
from kvtransit.agents.prefill.real_kv import RealKv
from kvtransit.agents.process import (
    Address,
    announce_ready,
    listen,
    new_registry,
    start_http,
    step_clock,
    timer_priority,
)
from kvtransit.flows.ring.group import RingGroupConfig, RingGroupFailed, RingGroupLeader
from kvtransit.flows.tier.prefix_cache import Lookup, PrefixReuse
from kvtransit.flows.tp.group.leader import GroupFailed, GroupLeader, LeaderConfig
from kvtransit.flows.tp.group.steps import TpSteps
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.judge.fidelity import lateness_mean, lateness_p99
from kvtransit.model.kv_scale import KvLayout
from kvtransit.model.scenario import REAL_MODEL_KV, Scenario
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE, StepWindow, chunk_stops, kv_segments
from kvtransit.model.serving.policies import PrefillQueue, ServingRequest
from kvtransit.model.serving.prefill_plan import (
    BatchEntry,
    ChunkedPrefillQueue,
    PrefillChunk,
    PrefillStepPlan,
    codec_on_gpu,
    plan_prefill_step,
)
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock, DeadlineSchedule, wake_stamp_ns
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.errors import ErrorCode
from kvtransit.wire.events import Bye, Error, FirstToken, Hello, KvBegin, Request, Role
from kvtransit.wire.limits import WIRE_VERSION, clip_message

log = logging.getLogger(__name__)


@dataclass
class _Admitted:
    """A request taken from the load generator, until its step has run (then its hand-off is `handoffs`')."""

    request: Request
    client: Endpoint


class PrefillAgent:
    def __init__(self, scenario: Scenario, *, name: str, listen: Address, kv_to: Address, metrics_listen: Address,
                 pool_via: Address | None = None, clock: Clock | None = None, tp_group: LeaderConfig | None = None,
                 ring_group: RingGroupConfig | None = None):
        """`pool_via`: the middlebox's pool port, for `--kv-pool pool` (prefix_cache.py). `clock`: what steps are
        held on (default: the monotonic clock, its wake-up lateness fed to the fidelity guard). `tp_group`: with
        `prefill_tp` > 1, the follower ranks to lead (the launcher starts them first; flows/tp/group/).
        `ring_group`: with `ring_share` > 0, the ring's follower ranks to lead (flows/ring/group.py)."""
        self.scenario = scenario
        self.name = name
        self.listen_address, self.kv_to, self.metrics_listen = listen, kv_to, metrics_listen
        self.registry, shared = new_registry("prefill")
        self.metrics = runtime_metrics.prefill_metrics(self.registry)
        self.clock, self.lateness = step_clock(shared, "prefill", clock,
                                               lambda: self.shortest_step_wall_s if self.steps else None)
        layout = scenario.kv_layout
        self.layout = layout
        self.kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed,
                              sample_path=scenario.kv_sample_path)
        self.gpu_codec = kv_frames.codec_for(scenario) if codec_on_gpu(scenario) else None
        # `--kv-sample real`: the first requests carry the real model's own KV, made before we say we are ready.
        self.real_kv = RealKv(scenario) if scenario.kv_sample == REAL_MODEL_KV else None
        # Prefix reuse (off by default): each request's lookup, kept until its step has run.
        self.prefix = (PrefixReuse(scenario, registry=self.registry, kv=self.kv, clock=self.clock, pool_via=pool_via,
                                   name=name) if scenario.kv_pool != "off" else None)
        self._lookups: dict[int, Lookup] = {}
        self._lookup_tasks = TaskSet("prefill lookups")
        self.queue: PrefillQueue | ChunkedPrefillQueue = (
            ChunkedPrefillQueue(scenario.prefill_chunk) if scenario.prefill_chunk
            else PrefillQueue(runs_alone=lambda r: scenario.is_ring_request(wire_id(r.request_id))))
        # Layer-wise or chunked: the KV is released as it is computed, not whole at the first token.
        self.streamed = scenario.handoff == HANDOFF_LAYERWISE or scenario.prefill_chunk > 0
        self.admitted: dict[int, _Admitted] = {}  # request id → until its (last chunk's) step has run
        self._schedules: dict[int, ReleaseSchedule] = {}  # streamed hand-offs whose last chunk has not run
        self._work = asyncio.Event()
        self.handoffs = HandoffLink(name=name, kv_to=kv_to, clock=self.clock, metrics=self.metrics)
        if (tp_group is None) != (scenario.prefill_tp == 1):
            raise ValueError(f"prefill_tp {scenario.prefill_tp} needs its group's followers (--tp-group), and only "
                             "then")
        link = scenario.scaled_scaleup_link
        self.group = (GroupLeader(tp_group, self.clock, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s)
                      if tp_group is not None else None)
        self.tp_steps = (TpSteps(scenario, "prefill", self.registry, size=scenario.prefill_tp, parallelism="tp")
                         if tp_group is not None else None)
        if (ring_group is None) == scenario.ring:
            raise ValueError(f"ring_share {scenario.ring_share} needs the ring's followers (--ring-group), and only "
                             "then")
        self.ring = RingGroupLeader(ring_group, scenario, self.clock) if ring_group is not None else None
        self.ring_metrics = runtime_metrics.ring_metrics(self.registry) if ring_group is not None else None
        # Each ring request's attention as measured, model seconds (the model's is Scenario.ring_model's, for all);
        # and how many its ring failed.
        self.ring_prompts: list[float] = []
        self.ring_failed = 0
        # stats for /stats and the report
        self.steps = 0
        self.shortest_step_wall_s = float("inf")
        self.cancelled = {"queued": 0, "handoff": 0}  # withdrawn by their client, by where they were
        self.group_failed = 0  # requests whose step's TP group failed (their clients told why)
        self.gpu_energy_j = 0.0

    # -- the loadgen side --------------------------------------------------------------------------------

    async def serve_client(self, endpoint: Endpoint) -> None:
        """One load generator's connection: say Hello, then admit every Request it sends until its Bye."""
        await endpoint.send(Hello(role=Role.PREFILL, version=WIRE_VERSION, name=self.name))
        while (event := await endpoint.next_event()) is not None:
            if isinstance(event, Request):
                self.admitted[event.request_id] = _Admitted(event, endpoint)
                if self.prefix is not None:  # look up (and fetch) its cached prefix first: TTFT pays for it
                    self._lookup_tasks.spawn(self._admit_after_lookup(self.prefix, event),
                                             f"lookup {event.request_id}")
                    continue
                self.queue.push(ServingRequest(event.request_id, event.prompt_tokens, event.output_tokens))
                self.metrics.queued_tokens.set(self.queue.queued_tokens)
                self._work.set()
            elif isinstance(event, Error) and event.request_id is not None:
                self.cancel(event.request_id, event.message)
            elif isinstance(event, Bye):
                break

    def cancel(self, request_id: int, reason: str) -> str:
        """Withdraw a request whose client went away (the module docstring); returns where it was: "queued" (or
        its prefix lookup still running), "handoff" (its KV held), or "" (done, or never here)."""
        where = ""
        if self.admitted.pop(request_id, None) is not None:
            # Not queued yet (its lookup is running: it is not queued after it) or queued: never computed. A
            # request whose earlier chunk is in the running step is queued too, for its next chunk.
            self.queue.cancel(request_id)
            self.metrics.queued_tokens.set(self.queue.queued_tokens)
            self._lookups.pop(request_id, None)
            self._schedules.pop(request_id, None)
            where = "queued"
        if self.handoffs.cancel(request_id, reason):  # staged by its first chunk's step, or its whole step
            where = "handoff"
        if where:
            self.cancelled[where] += 1
            log.info("request %d withdrawn by its client (%s): %s", request_id, where, reason)
        return where

    async def _admit_after_lookup(self, prefix: PrefixReuse, request: Request) -> None:
        try:
            lookup = await prefix.lookup(request)
        except Exception:  # a bug in the lookup must cost the request its reuse, never the request itself
            log.exception("prefix lookup of request %d failed; computing it whole", request.request_id)
            lookup = prefix.recompute(request)
        if request.request_id not in self.admitted:
            return  # withdrawn by its client while it was looked up
        self._lookups[request.request_id] = lookup
        # The batch budget counts the tokens the step computes (the cached ones are only re-read).
        self.queue.push(ServingRequest(request.request_id, request.prompt_tokens - lookup.cached_tokens,
                                       request.output_tokens))
        self.metrics.queued_tokens.set(self.queue.queued_tokens)
        self._work.set()

    # -- the step loop -----------------------------------------------------------------------------------

    def _cached_tokens(self, request_id: int) -> int:
        return self._lookups[request_id].cached_tokens if self.prefix is not None else 0

    def _batch_entry(self, item: ServingRequest | PrefillChunk) -> BatchEntry:
        """The step's view of a queued request (or of one chunk of it): its context before and after the step."""
        if isinstance(item, PrefillChunk):
            queued, start, stop, first, last = item.request, item.start, item.stop, item.first, item.last
        else:
            queued, start, stop, first, last = item, 0, item.prompt_tokens, True, True
        request_id = wire_id(queued.request_id)
        request = self.admitted[request_id].request
        cached = self._cached_tokens(request_id)  # what was queued is the prompt less its cached prefix
        return BatchEntry(request_id, cached + stop, request.output_tokens, cached + start, first, last)

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
                self._step_handoff(step[entry.request_id], entry, window)
            # The step ends when its timer wakes: that instant, not a later read of the clock, stamps its first
            # tokens (wake_stamp_ns says why). A TP group's step holds its compute, all-reduces real bytes with its
            # followers, then holds to the same end (flows/tp/group/steps.py).
            if plan.ring is not None:
                try:
                    late_ns = await self._ring_step(plan, start_ns, deadline_ns)
                except RingGroupFailed as exc:
                    await self._fail_step(plan, step, str(exc))
                    schedule = None
                    continue
                schedule = None  # the next step starts when the ring ended, as measured (not at its model end)
            elif plan.group is None:
                late_ns = await self.clock.sleep_until(deadline_ns)
            else:
                assert self.group is not None and self.tp_steps is not None
                try:
                    late_ns = await self.tp_steps.run(
                        self.group, self.clock, plan, fresh_start_ns=fresh_start_ns,
                        compute_end_ns=start_ns + round(self.scenario.wall_s(plan.compute_s) * 1e9),
                        end_ns=deadline_ns)
                except GroupFailed as exc:
                    await self._fail_step(plan, step, str(exc))
                    schedule = None
                    continue
            t_ns = wake_stamp_ns(deadline_ns, late_ns)
            self.steps += 1
            self.shortest_step_wall_s = min(self.shortest_step_wall_s, plan.wall_s)
            self.metrics.step_seconds.observe(plan.model_s)
            self.gpu_energy_j += plan.energy_j
            self.metrics.gpu_energy_joules.inc(plan.energy_j)
            finished = [entry for entry in plan.entries if entry.last_chunk]
            if self.prefix is not None:  # the blocks this step computed go to the cache, in the background
                for entry in finished:
                    rid = wire_id(entry.request_id)
                    self.prefix.write_back(rid, self._lookups.pop(rid))
            for entry in finished:
                await self._first_token(step[entry.request_id], t_ns)
                if not entry.hands_off:  # nothing to decode: done at prefill (as in the simulator)
                    self.metrics.requests.labels(outcome="ok").inc()

    async def _ring_step(self, plan: PrefillStepPlan, start_ns: int, deadline_ns: int) -> int:
        """A ring request's step from `start_ns`: the rest of its prompt held, then its attention round the ring
        (measured); how late it ended after `deadline_ns`, its model end (0: on time). Raises RingGroupFailed."""
        ring, metrics = plan.ring, self.ring_metrics
        assert ring is not None and self.ring is not None and metrics is not None
        attention_start_ns = deadline_ns - round(self.scenario.wall_s(ring.attention_s) * 1e9)
        try:  # ordered now, at the step's start: every rank is at the ring when the rest of the prompt is done
            done = await self.ring.prompt(attention_start_ns)
        except RingGroupFailed:
            self.ring_failed += 1
            metrics.prompts.labels(outcome="failed").inc()
            raise
        end_ns = self.clock.now_ns()
        measured_s = self.scenario.model_s((end_ns - attention_start_ns) / 1e9)
        self.ring_prompts.append(measured_s)
        metrics.prompt_seconds.observe(measured_s)
        metrics.prompt_model_seconds.inc(ring.attention_s)
        metrics.prompts.labels(outcome="ok").inc()
        metrics.hop_bytes.inc(done.raw_bytes / self.scenario.ring_scale)
        return max(0, end_ns - deadline_ns)

    def ring_stats(self) -> dict[str, Any]:
        """The ring requests' attention, measured and modelled (model seconds), and rank 0's side of the ring."""
        assert self.ring is not None
        return {"measured_s": list(self.ring_prompts), "model_s": self.scenario.ring_model.attention_s,
                "failed": self.ring_failed, **self.ring.stats()}

    async def _fail_step(self, plan: PrefillStepPlan, step: dict[Hashable, _Admitted], reason: str) -> None:
        """The TP group failed during the step: none of its requests gets a first token; each one's hand-off (staged
        as the step began) is released and aborted downstream, its later chunks unqueued, and its client told why."""
        for entry in plan.entries:
            rid = wire_id(entry.request_id)
            self.handoffs.cancel(rid, reason)
            self.admitted.pop(rid, None)
            self.queue.cancel(rid)
            self._schedules.pop(rid, None)
            self._lookups.pop(rid, None)
            self.group_failed += 1
            try:
                await step[entry.request_id].client.send(Error(code=ErrorCode.REQUEST_FAILED,
                                                               message=clip_message(reason), request_id=rid))
            except (ConnectionError, RuntimeError) as exc:
                log.warning("could not tell the client request %d failed: %s", rid, exc)
        self.metrics.queued_tokens.set(self.queue.queued_tokens)

    def _step_handoff(self, admitted: _Admitted, entry: BatchEntry, window: StepWindow) -> None:
        """What this step does to a request's hand-off: staged with its first chunk (the whole prompt without
        chunking); a later chunk's step is added to its release schedule."""
        rid = admitted.request.request_id
        if not entry.first_chunk:
            self._schedules[rid].plan(entry.prompt_tokens, window)
        else:
            self._stage_handoff(admitted, entry, window)
        if entry.last_chunk:
            self._schedules.pop(rid, None)

    def _stage_handoff(self, admitted: _Admitted, entry: BatchEntry, window: StepWindow) -> None:
        """The hand-off starts at the first token, the end of this step (REFERENCE §4). Its KV goes to the
        middlebox as soon as the link reaches it (now, on an idle link), stamped with that time, and the
        middlebox holds it until then: the host's own cost of producing, framing and relaying the bytes
        overlaps the modelled step instead of landing on the hand-off (which a kernel shaper, tc, could never
        win back). The bytes are made as they are sent (handoff_frames.py).

        Streamed (layer-wise, chunked prefill), each frame carries its own release time instead (its layer's
        compute ends then, model/serving/layerwise.py), and the middlebox holds each until that; with chunked prefill
        the first token is not planned yet at the first chunk (KvBegin.first_token_ns 0: decode takes it from the last
        frame's release time, the last chunk's end)."""
        request = admitted.request
        first_token_ns = window.end_ns if entry.last_chunk else 0
        schedule = None
        if self.streamed:
            cached = self._cached_tokens(request.request_id)
            stops = kv_segments(chunk_stops(request.prompt_tokens, cached, self.scenario.prefill_chunk),
                                max(1, self.scenario.sinks))
            schedule = ReleaseSchedule(self.scenario.handoff, self._kv_of(request)[1].layers, stops)
            schedule.plan(entry.prompt_tokens, window)
            self._schedules[request.request_id] = schedule
        begin, frames = self._make_frames(request, first_token_ns, schedule.stops if schedule else ())
        self.handoffs.hold(HeldHandoff(request, admitted.client, begin, frames, schedule=schedule,
                                       deadline_ns=window.end_ns + round(HANDOFF_DEADLINE_S * 1e9)))

    async def _first_token(self, admitted: _Admitted, t_ns: int) -> None:
        try:
            await admitted.client.send(FirstToken(request_id=admitted.request.request_id, t_ns=t_ns))
        except (ConnectionError, RuntimeError) as exc:
            log.warning("could not send first token of request %d: %s", admitted.request.request_id, exc)

    def _make_frames(self, request: Request, first_token_ns: int,
                     stops: tuple[int, ...] = ()) -> tuple[KvBegin, HandoffFrames]:
        """The hand-off's KvBegin and the recipe of its chunks (made when the link sends them); `stops`: its token
        segments (chunked prefill), () for one."""
        source, layout, tokens = self._kv_of(request)
        codec_name = self.scenario.codec if self.gpu_codec is not None else "none"
        codec = self.gpu_codec
        if codec is not None and tokens < self.scenario.sinks:
            codec = kv_frames.codec_for(self.scenario, tokens)
        frames = HandoffFrames(request.request_id, tokens, layout, source, codec, codec_name,
                               stops if len(stops) > 1 else ())
        # The KvBegin keeps the request's own prompt length (decode's batch and KV reservation are the model's); a
        # real-KV hand-off's frames carry its real tokens, and its raw bytes are theirs.
        begin = KvBegin(request_id=request.request_id, prompt_tokens=request.prompt_tokens,
                        output_tokens=request.output_tokens, n_layers=layout.layers, n_chunks=frames.n_chunks,
                        raw_bytes=layout.request_bytes(tokens), codec=codec_name, first_token_ns=first_token_ns)
        return begin, frames

    def _kv_of(self, request: Request) -> tuple[KvSource, KvLayout, int]:
        """Where the request's KV comes from, its layout and its tokens: synthetic over its prompt, or, for a request
        that carries real KV (`--kv-sample real`), the real model's over as many tokens as its bytes (real_kv.py)."""
        if self.real_kv is not None and self.scenario.carries_real_kv(request.request_id):
            assert self.real_kv.layout is not None  # loaded before we said we were ready
            return self.real_kv, self.real_kv.layout, self.real_kv.tokens_for(request.request_id,
                                                                              request.prompt_tokens).tokens
        return self.kv, self.layout, request.prompt_tokens

    # -- stats ---------------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "role": "prefill",
            "name": self.name,
            "steps": self.steps,
            "gpu_energy_j": self.gpu_energy_j,
            **self.handoffs.stats(),
            "cancelled": dict(self.cancelled),
            "timer_lateness_p99_s": lateness_p99(self.lateness),
            "timer_lateness_mean_s": lateness_mean(self.lateness),
            "timer_wakeups": len(self.lateness),
            # What the holds wait on: "timerfd" (sub-ms, sleeping) or "loop" (ms timer + 1 ms spin).
            "timer": self.clock.timer,
            "timer_priority": timer_priority(self.clock),
            "shortest_step_wall_s": self.shortest_step_wall_s if self.steps else None,
            "host_kv_s": self.handoffs.make_s,
            **({"real_kv": self.real_kv.stats()} if self.real_kv is not None else {}),
            **({"prefix": self.prefix.stats()} if self.prefix is not None else {}),
            **({"tp_group": self.tp_steps.stats(self.group), "tp_group_failed_requests": self.group_failed}
               if self.tp_steps is not None else {}),
            **({"ring": self.ring_stats()} if self.ring is not None else {}),
        }

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        if self.real_kv is not None:
            await self.real_kv.load()
        await self.handoffs.connect()
        if self.group is not None:
            await self.group.start()  # its followers are up (the launcher started them first): a failure is fatal
        if self.ring is not None:
            await self.ring.start()  # as the TP group's: its followers are up
        server = await listen(self.listen_address, "--listen", self.serve_client, Role.PREFILL, Role.LOADGEN)
        http = await start_http(self.metrics_listen, self.registry, self.stats)
        announce_ready("prefill", self.name, listen_port=server.port, metrics_port=http.port)
        loops = TaskSet("prefill")
        step = loops.spawn(self.step_loop(), "step loop")
        handoffs = loops.spawn(self.handoffs.run(), "hand-offs")
        stopper = loops.spawn(stop.wait(), "stop")
        try:
            done, _ = await asyncio.wait([step, handoffs, stopper], return_when=asyncio.FIRST_COMPLETED)
            for loop in (step, handoffs):  # a loop only ends by failing; the stop task ends cleanly
                if loop in done and (failure := loop.exception()) is not None:
                    raise failure
        finally:
            await loops.close()
            await self._lookup_tasks.close()
            await self.handoffs.close()
            if self.prefix is not None:
                await self.prefix.close()
            await server.shutdown(1.0)
            await http.close()
            if self.group is not None:
                await self.group.close()
            if self.ring is not None:
                await self.ring.close()
