"""`kvtransit collective`: a TP-n group as n rank processes (+ a switch process) doing real all-reduces.

Plan (pure arithmetic over flows/tp/model.py): what each rank holds and sends, at the run's scale and
dilation. Run: start the switch (if any) and the n ranks as child processes (`python -m
kvtransit.flows.tp.rank`; the switch through the middlebox's own entry point, `kvtransit middlebox --placement
switch --ranks N --switch-config JSON`, as a user starts one), read each one's readiness line, tell each rank its
peer and the group's start time on stdin, collect one result line from each, and compare the measured decode
step and all-reduce share with the model's. Every child is killed by its pid at the end, on error and on a
timeout. One OS process per rank for n = 2, 4 and 8 on this 2-core box: the ranks mostly sleep (held compute,
held link time), so 8 (+ the switch) fit; it is the message rate, not the process count, that the host must
carry, and the granularity below is chosen for that.

Granularity: per layer, every all-reduce of every layer (2·L a step) is real bytes; per step, one all-reduce of
all the step's activations (2·L × S) is real bytes and the other 2·L − 1 all-reduces' latency terms are held on
the clock (the model's figure), so the step's modelled time is the same. Per layer is chosen ("auto") when a
modelled hop at the chosen dilation is at least the host's cost of a hop (HOST_HOP_S, × ranks per core).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtransit.flows.tp.model import (
    ALLREDUCE_RING,
    ALLREDUCE_SWITCH,
    ParallelStep,
    allreduce_s,
    check_ep,
    check_tp,
    tp_decode_step,
    tp_prefill_step,
)
from kvtransit.flows.tp.moe_dispatch import AT_GPU, BF16_DISPATCH, DISPATCH_BF16, DispatchPlacement, place_dispatch
from kvtransit.harness.children import (
    READY_TIMEOUT_S,
    Child,
    collect_results,
    reap,
    sorted_results,
    spawn,
    spawn_argv,
)
from kvtransit.harness.host import HOST_HOP_S, PROCESSES_PER_CORE
from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import group_fidelity, model_gap
from kvtransit.model.module.budget import Module, Policy

GRANULARITIES = ("auto", "layer", "step")
GROUP_ID = 1
# The start of step 0 is this far after the last rank's readiness: time to dial the ring or the switch.
START_MARGIN_S = 1.0
# A collective that hears nothing from a peer for this long, or this many modelled steps, fails (not hangs).
MIN_DEADLINE_S = 5.0
DEADLINE_STEPS = 5


@dataclass(frozen=True)
class CollectivePlan:
    model: ModelSpec
    device: Device
    link: Link
    allreduce: str
    n: int
    ep: bool  # EP = TP = n (a MoE model): L all-reduces and L dispatch + combine a step
    step_kind: str  # "decode" or "prefill"
    tokens: int  # decode: sequences (one token each); prefill: Σ prompt tokens
    context: int  # decode: per sequence
    steps: int
    dilation: float
    modelled: ParallelStep  # the model's step (dilation 1)
    values: int  # BF16 values in one real all-reduce
    alltoall_values: int  # BF16 values a hop of a real all-to-all carries (0: none)
    effective_scale: float  # values / (tokens × d) per all-reduce
    granularity: str  # "layer" or "step"
    why: str
    collectives: int  # real all-reduces a step
    compute_s: float  # held, × dilation
    held_s: float  # latency held by the model a step (per-step granularity), × dilation
    rate_Bps: float  # the link at scale and dilation
    latency_s: float  # × dilation
    module: Module  # the switch's, its added latency × dilation
    deadline_s: float
    dispatch: DispatchPlacement = BF16_DISPATCH  # EP: what the dispatch carries, where it is cast

    def rank_plan(self, rank: int) -> dict[str, Any]:
        return {"group": GROUP_ID, "rank": rank, "size": self.n, "mode": self.allreduce, "steps": self.steps,
                "collectives": self.collectives, "values": self.values, "compute_s": self.compute_s,
                "held_s": self.held_s, "deadline_s": self.deadline_s, "per_layer": 1 if self.ep else 2,
                "alltoall_values": self.alltoall_values, "dispatch": self.dispatch.codec}


def _check_emulation(allreduce: str, granularity: str, scale: float, dilation: float, steps: int) -> None:
    if allreduce not in (ALLREDUCE_RING, ALLREDUCE_SWITCH):
        raise ConfigError(f"unknown all-reduce {allreduce!r} (choose from: ring, switch)")
    if granularity not in GRANULARITIES:
        raise ConfigError(f"unknown granularity {granularity!r} (choose from: {', '.join(GRANULARITIES)})")
    if not 0 < scale <= 1:
        raise ConfigError(f"scale must be in (0, 1], got {scale!r}")
    if not dilation >= 1:
        raise ConfigError(f"dilation must be >= 1, got {dilation!r}")
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")


def plan_collective(model: ModelSpec, device: Device, link: Link, *, tp: int = 0, ep: int = 0,
                    allreduce: str = ALLREDUCE_RING, tokens: int = 1, context: int = 2048,
                    prompts: Sequence[int] | None = None, steps: int = 5, scale: float = 1.0, dilation: float = 1.0,
                    granularity: str = "auto", module: Module = Module(), cores: int | None = None,
                    dispatch: str = DISPATCH_BF16, dispatch_at: str = AT_GPU,
                    policy: Policy = Policy.REJECT) -> CollectivePlan:
    """A decode step of `tokens` sequences at `context` each, or with `prompts` a prefill step, on a TP-`tp`
    group, or with `ep` an EP = TP = `ep` group of a MoE model (ring only: the all-to-all goes between ranks),
    its dispatch in BF16 or FP8 (`dispatch`; `dispatch_at` the GPU, or in transit where the module's `policy`
    judges it: flows/tp/moe_dispatch.py)."""
    _check_emulation(allreduce, granularity, scale, dilation, steps)
    placed = place_dispatch(dispatch, dispatch_at, module, policy)
    if dispatch != DISPATCH_BF16 and not ep:
        raise ConfigError(f"--dispatch {dispatch} needs an all-to-all: expert parallelism (--ep 2 on a MoE model)")
    n = ep or tp
    if ep:
        check_ep(model, ep)
        if allreduce != ALLREDUCE_RING:
            raise ConfigError("with --ep the live group is a ring (its all-to-all goes between ranks): "
                              "--allreduce ring (valid: ring)")
    else:
        check_tp(model, tp)
    if n < 2:
        raise ConfigError(f"a collective needs a group of at least 2 (valid: 2, 4, 8), got {n}")
    if prompts is None and (tokens < 1 or context < 0):
        raise ConfigError(f"tokens must be >= 1 and context >= 0, got {tokens}, {context}")
    cores = cores or os.cpu_count() or 1
    processes = n + (1 if allreduce == ALLREDUCE_SWITCH else 0)
    if processes > PROCESSES_PER_CORE * cores + 1:
        raise ConfigError(f"a group of {n} needs {processes} processes; this host has {cores} cores "
                          f"(valid: a group of up to {PROCESSES_PER_CORE * cores})")
    if prompts is not None:
        modelled = tp_prefill_step(model, device, link, list(prompts), tp=tp, ep=ep, allreduce=allreduce,
                                   module=module, dispatch=placed)
        step_kind, tokens, context = "prefill", sum(prompts), 0
    else:
        modelled = tp_decode_step(model, device, link, tp=tp, ep=ep, batch=tokens, context_total=context * tokens,
                                  allreduce=allreduce, module=module, dispatch=placed)
        step_kind = "decode"
    per_reduce = tokens * model.d_model
    values = max(n, math.ceil(per_reduce * scale / n) * n)  # whole chunks of a ring, ≥ one value each
    effective = values / per_reduce
    nbytes = modelled.allreduce_bytes  # S, model bytes
    hop_s = (link.latency_s + (nbytes / n if allreduce == ALLREDUCE_RING else nbytes) / link.bandwidth_Bps) * dilation
    floor_s = HOST_HOP_S * max(1.0, processes / cores)
    per_layer_fits = hop_s >= floor_s
    if granularity == "auto":
        granularity = "layer" if per_layer_fits else "step"
        why = (f"auto: a modelled hop at dilation {dilation:g} is {hop_s * 1e6:.0f} µs, "
               + (f"at least the host's {floor_s * 1e6:.0f} µs" if per_layer_fits else
                  f"under the host's {floor_s * 1e6:.0f} µs (per-layer messages could not keep up)"))
    else:
        why = f"asked for per {granularity} (a modelled hop is {hop_s * 1e6:.0f} µs, the host's {floor_s * 1e6:.0f} µs)"
    # EP's all-to-all as 2(n − 1) ring hops of 1/n of the tokens' k activations each (rank.py: _Ring.alltoall).
    a2a_hop = max(1, round(tokens * model.experts_active * model.d_model / n * effective)) if ep else 0
    reduces = modelled.allreduces
    if granularity == "layer":
        collectives, held = reduces, 0.0
    else:
        collectives = 1
        values *= reduces
        a2a_hop *= modelled.alltoalls
        held = reduces * modelled.allreduce_each_s - allreduce_s(allreduce, reduces * nbytes, n, link, module)
        if ep:  # the real all-to-all carries every layer's bytes with one set of latencies
            held += (modelled.alltoalls - 1) * 2 * (n - 1) * link.latency_s
    rate = link.bandwidth_Bps * effective / dilation
    deadline = max(MIN_DEADLINE_S, DEADLINE_STEPS * modelled.total_s * dilation)
    return CollectivePlan(
        model, device, link, allreduce, n, bool(ep), step_kind, tokens, context, steps, dilation, modelled, values,
        # The GPU's FP8 casts are held with the compute (fused into the layers: flows/tp/moe_dispatch.py).
        a2a_hop, effective, granularity, why, collectives, (modelled.compute_s + modelled.cast_s) * dilation,
        max(0.0, held) * dilation,
        rate, link.latency_s * dilation,
        Module(module.name, module.line_rate_Bps, module.ops_per_byte, module.pj_per_input_bit,
               module.added_latency_s * dilation),
        deadline, placed)


@dataclass
class CollectiveReport:
    plan: CollectivePlan
    ranks: list[dict[str, Any]] = field(default_factory=list)
    switch: dict[str, Any] | None = None
    failures: list[str] = field(default_factory=list)  # every rank's reason, in rank order

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.ranks) == self.plan.n and all(r["ok"] for r in self.ranks)

    def _steps(self) -> list[tuple[float, float]]:
        """Per step (warm-up step 0 left out when there are more): the slowest rank's step (the group's) and the
        ranks' median all-reduce share (a rank's compute wake-up lateness moves time between its two parts)."""
        if not self.ranks or not all(r["steps"] for r in self.ranks):
            return []
        count = min(len(r["steps"]) for r in self.ranks)
        first = 1 if count > 1 else 0
        rows = []
        for k in range(first, count):
            steps = [r["steps"][k] for r in self.ranks]
            rows.append((max(s["step_s"] for s in steps),
                         statistics.median(s["collective_s"] / s["step_s"] for s in steps)))
        return rows

    def summary(self) -> dict[str, Any]:
        p, m = self.plan, self.plan.modelled
        rows = self._steps()
        d = p.dilation
        # Steps are held on absolute deadlines, so a late step is followed by a short one: the mean is the rate.
        measured_step = statistics.fmean(s for s, _ in rows) / d if rows else math.nan
        measured_share = statistics.median(share for _, share in rows) if rows else math.nan
        return {
            "model": p.model.name, "device": p.device.name, "parallelism": "ep" if p.ep else "tp", "group": p.n,
            "step": p.step_kind, "allreduce": p.allreduce, "link": p.link.name,
            "tokens": p.tokens, "context": p.context, "steps": p.steps, "dilation": p.dilation,
            "scale": p.effective_scale, "granularity": p.granularity, "granularity_why": p.why,
            "real_allreduces_per_step": p.collectives, "values_per_allreduce": p.values,
            "processes": p.n + (1 if p.allreduce == ALLREDUCE_SWITCH else 0),
            "model_step_s": m.total_s, "model_compute_s": m.compute_s, "model_allreduce_s": m.allreduce_s,
            "model_alltoall_s": m.alltoall_s, "model_collective_share": m.collective_share,
            "dispatch": p.dispatch.to_json() if p.ep else None, "model_cast_s": m.cast_s,
            "measured_step_s": measured_step, "measured_collective_share": measured_share,
            "step_error": measured_step / m.total_s - 1 if rows else math.nan,
            "share_error_points": (measured_share - m.collective_share) * 100 if rows else math.nan,
            "sums_checked": sum(r.get("sums_checked", 0) for r in self.ranks),
            "late_s": max((r.get("late_s", 0.0) for r in self.ranks), default=0.0),
            "ok": self.ok, "failures": self.failures, "switch": self.switch,
            **group_fidelity(self.ok, self.failures, {"step": model_gap(measured_step, m.total_s, d, "the step")}),
        }


def switch_argv(plan: CollectivePlan) -> list[str]:
    """The switch's command line: the middlebox at placement switch serving the plan's group (cli/middlebox.py),
    its ports and module at the plan's scale and dilation. Plain asyncio, as the ranks run."""
    config = {"rate_Bps": plan.rate_Bps, "latency_s": plan.latency_s, "module_ops_per_byte": plan.module.ops_per_byte,
              "module_latency_s": plan.module.added_latency_s, "module_pj_per_bit": plan.module.pj_per_input_bit,
              "scale": plan.effective_scale, "deadline_s": plan.deadline_s, "collectives": plan.collectives}
    return ["-m", "kvtransit.cli", "middlebox", "--placement", "switch", "--ranks", str(plan.n), "--group",
            str(GROUP_ID), "--name", "switch", "--loop", "asyncio", "--switch-config", json.dumps(config)]


async def run_collective(plan: CollectivePlan, *, kill_rank: int | None = None, kill_after_s: float = 0.0,
                         timeout_s: float | None = None) -> CollectiveReport:
    """Start the group, run it, collect every result. `kill_rank` is SIGKILLed `kill_after_s` after step 0
    starts (the dead-rank test). Every child is gone when this returns."""
    report = CollectiveReport(plan)
    children: list[Child] = []
    link = {"rate_Bps": plan.rate_Bps, "latency_s": plan.latency_s}
    try:
        switch: Child | None = None
        if plan.allreduce == ALLREDUCE_SWITCH:
            switch = await spawn_argv("switch", switch_argv(plan))
            children.append(switch)
            switch_port = (await switch.wait_ready(READY_TIMEOUT_S, one_line=True))["listen_port"]
        ranks = [await spawn(f"rank {r}", "kvtransit.flows.tp.rank", {"plan": plan.rank_plan(r), **link})
                 for r in range(plan.n)]
        children += ranks
        ports = [(await rank.wait_ready(READY_TIMEOUT_S, one_line=True))["listen_port"] for rank in ranks]
        start_ns = time.monotonic_ns() + round(START_MARGIN_S * 1e9)
        for r, rank in enumerate(ranks):
            go: dict[str, Any] = {"start_ns": start_ns}
            if switch is not None:
                go["switch"] = ["127.0.0.1", switch_port]
            else:
                go["next"] = ["127.0.0.1", ports[(r + 1) % plan.n]]
            await rank.send_go(go)
        budget = timeout_s if timeout_s is not None else (
            START_MARGIN_S + plan.steps * plan.modelled.total_s * plan.dilation * 3 + 2 * plan.deadline_s + 10)
        results = await collect_results([*ranks, *([switch] if switch is not None else [])], budget,
                                        kill=None if kill_rank is None else ranks[kill_rank],
                                        kill_at_ns=start_ns + round(kill_after_s * 1e9))
        if switch is not None:
            report.switch = results.pop()  # the sums it made, once every rank has ended
        report.ranks, report.failures = sorted_results(ranks, results)
    except TimeoutError:
        report.failures.append("the group did not finish within its time budget")
    finally:
        await reap(children)
    return report
