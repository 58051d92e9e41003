"""`kvtransit weights`: weight streaming live, a store and an instance over a shaped link (flows/weights/roles.py): the
instance's cold start (its weights streamed in before it serves), then LoRA adapters paged in on demand while it
serves a request stream, measured beside the model (flows/weights/model.py).

Plan: the workload (Poisson arrivals, each request's adapter drawn from a Zipf popularity, both seeded), the bytes
(the model's BF16 weights, a rank-r adapter on every layer's q/k/v/o, at the run's scale), the prefill held per
request (model/cost/roofline.py), and the kernel: a weight flow needs a lossless one (model/module/budget.py: flow_check
refuses anything else before a process starts); `none`, or zstd, whose data-dependent branches the module does not
publish, so it runs at the two hosts when the policy allows (`--policy host`). Run: start the store and the instance,
read their readiness lines, tell the instance the store's address and the start time, collect both result lines, reap
both by pid (harness/children.py). Judge: the cold start against the model's pull of the bytes that crossed, and every
request's TTFT against the same requests served by the model (flows/weights/model.py: serve_adapter_requests, one at a
time, first come first served) with each load at the bytes that crossed.

Scale: every byte is scaled by `scale` and so is the link's rate (`auto`: the rate this host carries,
model/kv_scale.py's HOST_BUDGET_BPS); time is dilated where a load is shorter than the host's measured cost of one.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from kvtransit.flows.weights import content
from kvtransit.flows.weights.content import LosslessKernel
from kvtransit.flows.weights.model import AdapterShape, ZipfPopularity, page_adapters, pull_s, serve_adapter_requests
from kvtransit.flows.weights.roles import WeightsPlan
from kvtransit.harness.children import Child, reap, run_roles, spawn
from kvtransit.harness.host import HOST_HOP_S
from kvtransit.model.catalog.codecs import CODEC_NAMES, codec_declaration
from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.roofline import prefill_step_s
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import group_fidelity, model_gap
from kvtransit.model.kv_scale import HOST_BUDGET_BPS, host_dilation, resolve_dilation
from kvtransit.model.module.budget import Action, KernelDeclaration, Module, Policy, budget_check, flow_check

START_MARGIN_S = 1.0
MIN_DEADLINE_S = 10.0
PROCESSES = 2
# zstd level 3 on BF16 values of a weight's spread: 1.28 (docs/results/weights.md: 1.277-1.287 as laid out, real and
# synthetic alike); the declared ratio a user would write down, the measured one is the run's.
ZSTD_DECLARED_RATIO = 1.28
# The largest weights a run holds in each process (the store's, the instance's copy to check against, zstd's
# buffers): a 2-core, 24 GiB box; scale down a larger model.
MAX_SCALED_WEIGHT_BYTES = 1 << 30
HOST_TIMING_REPEATS = 3
# The light-load target: a paged-in adapter's TTFT within 2 % of the model.
TTFT_TOLERANCE = 0.02

LOSSLESS_KERNELS = {
    "none": KernelDeclaration("none", ratio=1.0, lossless=True),
    "zstd": KernelDeclaration("zstd", ratio=ZSTD_DECLARED_RATIO, op_types=frozenset({"comparison"}), lossless=True),
}


def kernel_declaration(name: str) -> KernelDeclaration:
    """A weight flow's kernel by name: the lossless ones here, or a KV codec (refused by flow_check: lossy)."""
    if name in LOSSLESS_KERNELS:
        return LOSSLESS_KERNELS[name]
    if name in CODEC_NAMES:
        return codec_declaration(name)
    raise ConfigError(f"unknown kernel {name!r} (choose from: {', '.join([*LOSSLESS_KERNELS, *CODEC_NAMES[1:]])})")


def _even(nbytes: float) -> int:
    return max(2, 2 * round(nbytes / 2))  # whole BF16 values


@dataclass(frozen=True)
class WeightsRunPlan:
    model: ModelSpec
    device: Device
    link: Link
    kernel: str
    runs_at: str  # "-" (none: nothing runs), "hosts" (zstd at both ends)
    shape: AdapterShape
    adapter_count: int
    capacity: int
    requests: int
    rate_rps: float
    prompt_tokens: int
    arrivals_s: tuple[float, ...]  # model seconds after the instance is ready
    adapters: tuple[int, ...]
    prefill_s: float
    scale: float
    scale_why: str
    weights_bytes: int  # scaled
    adapter_bytes: int  # scaled
    host_load_s: float  # measured: one adapter made, encoded, decoded and checked on this host
    dilation: float
    dilation_why: str
    rate_Bps: float
    latency_s: float
    deadline_s: float

    def role_plan(self) -> dict[str, Any]:
        d = self.dilation
        return WeightsPlan(self.weights_bytes, self.adapter_bytes, self.kernel, self.capacity,
                           tuple(a * d for a in self.arrivals_s), self.adapters, self.prefill_s * d,
                           self.deadline_s).to_json()

    def pull_at_s(self, wire_bytes: float) -> float:
        """The model's load of `wire_bytes` (at scale) that crossed: a request and its answer
        (flows/weights/model.py)."""
        return pull_s(wire_bytes / self.scale, self.link)


def measure_host_load_s(adapter_bytes: int, kernel: str, repeats: int = HOST_TIMING_REPEATS) -> float:
    """One adapter made, encoded, decoded and checked on this host (the store's and the instance's work for a
    miss): the median of `repeats`."""
    codec = LosslessKernel(kernel)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        raw = content.adapter(i, adapter_bytes)
        codec.decode(codec.encode(raw), content.adapter(i, adapter_bytes), "timing")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def plan_weights(model: ModelSpec, device: Device, link: Link, *, kernel: str = "none",
                 policy: Policy = Policy.REJECT, module: Module = Module(), adapters: int = 100, rank: int = 16,
                 capacity: int = 8, requests: int = 40, rate: float = 2.0, prompt_tokens: int = 2048,
                 zipf: float = 1.0, seed: int = 0, scale: float | str = "auto",
                 dilation: float | str = "auto") -> WeightsRunPlan:
    decl = kernel_declaration(kernel)
    flow_check(decl, "weights")  # a lossy kernel is refused here, with the reason
    runs_at = "-"
    if kernel != "none":
        verdict = budget_check(decl, module, policy)
        if verdict.action is Action.REJECTED:
            raise ConfigError(f"kernel {kernel} on the weight flow: {verdict.describe()}; --policy host runs it at "
                              "the store and the instance (valid: --policy reject|host)")
        runs_at = "hosts" if verdict.action is Action.ON_HOST else "transit"
    if requests < 1 or not rate > 0 or prompt_tokens < 1:
        raise ConfigError(f"--requests, --rate and --prompt must be > 0, got {requests}, {rate}, {prompt_tokens}")
    shape = AdapterShape(model, rank)
    ids = tuple(ZipfPopularity(adapters, zipf, seed).draws(requests))
    page_adapters(ids, capacity)  # checks the capacity
    rng = random.Random(seed)
    clock, arrivals = 0.0, []
    for _ in range(requests):
        clock += rng.expovariate(rate)
        arrivals.append(clock)
    if scale == "auto":
        scale = min(1.0, HOST_BUDGET_BPS / link.bandwidth_Bps)
        scale_why = f"auto: the link's rate scaled to {HOST_BUDGET_BPS / 1e6:g} MB/s, what this host carries"
    else:
        scale = float(scale)
        if not 0 < scale <= 1:
            raise ConfigError(f"--scale must be in (0, 1] or auto, got {scale!r}")
        scale_why = "asked for"
    weights_bytes, adapter_bytes = _even(model.resident_weight_bytes * scale), _even(shape.nbytes * scale)
    if weights_bytes > MAX_SCALED_WEIGHT_BYTES:
        raise ConfigError(f"{model.name}'s weights at scale {scale:g} are {weights_bytes / 1e9:.2f} GB, over the "
                          f"{MAX_SCALED_WEIGHT_BYTES / 1e9:.2f} GB a run holds per process: give a --scale of at most "
                          f"{MAX_SCALED_WEIGHT_BYTES / model.resident_weight_bytes:.3g}")
    host_load = measure_host_load_s(adapter_bytes, kernel)
    load = pull_s(shape.nbytes, link, decl.ratio)
    auto = host_dilation(load, (host_load + 2 * HOST_HOP_S) * PROCESSES / 2, link.bandwidth_Bps * scale)
    dilation, why = resolve_dilation(dilation, auto)
    if why == "auto":
        why = (f"auto: an adapter's modelled load of {load * 1e3:,.2f} ms against the host's {host_load * 1e3:,.2f} "
               f"ms a load (measured), and {link.bandwidth_Bps * scale / 1e6:,.1f} MB/s of scaled link")
    prefill = prefill_step_s(model, device, 1, [prompt_tokens])
    cold = pull_s(model.resident_weight_bytes, link, decl.ratio)
    return WeightsRunPlan(
        model, device, link, kernel, runs_at, shape, adapters, capacity, requests, rate, prompt_tokens,
        tuple(arrivals), ids, prefill, scale, scale_why, weights_bytes, adapter_bytes, host_load, dilation, why,
        link.bandwidth_Bps * scale / dilation, link.latency_s * dilation,
        max(MIN_DEADLINE_S, 3 * (cold + load + prefill) * dilation))


@dataclass
class WeightsReport:
    plan: WeightsRunPlan
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.results) == PROCESSES and all(r["ok"] for r in self.results.values())

    def summary(self) -> dict[str, Any]:
        p, d = self.plan, self.plan.dilation
        inst = self.results.get("instance") if self.ok else None
        base = {"model": p.model.name, "device": p.device.name, "link": p.link.name, "kernel": p.kernel,
                "runs_at": p.runs_at, "adapters": p.adapter_count, "rank": p.shape.rank, "capacity": p.capacity,
                "requests": p.requests, "rate_rps": p.rate_rps, "prompt_tokens": p.prompt_tokens,
                "adapter_bytes": p.shape.nbytes, "weights_bytes": p.model.resident_weight_bytes,
                "scale": p.scale, "scale_why": p.scale_why, "dilation": d, "dilation_why": p.dilation_why,
                "model_prefill_s": p.prefill_s, "ok": self.ok, "failures": self.failures,
                "store": self.results.get("store")}
        if inst is None:
            return {**base, **group_fidelity(self.ok, self.failures, {})}
        records = inst["requests"]
        wire = [r["wire_bytes"] for r in records]
        modelled = serve_adapter_requests(p.arrivals_s, p.adapters, p.capacity,
                                          [p.pull_at_s(w) if w else 0.0 for w in wire], p.prefill_s)
        errors = [r["ttft_s"] / d / m.ttft_s - 1 for r, m in zip(records, modelled, strict=True)]
        misses = [e for e, r in zip(errors, records, strict=True) if not r["hit"]]
        hits = [e for e, r in zip(errors, records, strict=True) if r["hit"]]
        store = self.results["store"]
        cold_model = p.pull_at_s(inst["weights_wire_bytes"])
        miss_ttft = [r["ttft_s"] / d for r in records if not r["hit"]]
        # Per request, measured over modelled; the median of each kind judged against 1 (model_gap's band).
        ratios = {kind: [1 + e for e in errs] for kind, errs in (("paged-in TTFT", misses), ("resident TTFT", hits))}
        gaps = {"cold start": model_gap(inst["cold_start_s"] / d, cold_model, d, "the cold start"),
                **{kind: model_gap(statistics.median(r), 1.0, d, f"a {kind}") for kind, r in ratios.items() if r}}
        return {**base, **group_fidelity(self.ok, self.failures, gaps),
                "cold_start_s": inst["cold_start_s"] / d, "model_cold_start_s": cold_model,
                "cold_start_error": inst["cold_start_s"] / d / cold_model - 1,
                "wire_ratio": store["raw_bytes"] / store["wire_bytes"] if store["wire_bytes"] else math.nan,
                "misses": len(misses), "hits": len(hits),
                "model_misses": sum(not m.hit for m in modelled),
                "ttft_median_s": statistics.median(r["ttft_s"] / d for r in records),
                "model_ttft_median_s": statistics.median(m.ttft_s for m in modelled),
                "miss_ttft_median_s": statistics.median(miss_ttft) if miss_ttft else math.nan,
                "miss_wait_median_s": (statistics.median(r["wait_s"] / d for r in records if not r["hit"])
                                       if misses else math.nan),
                "miss_ttft_error_median": statistics.median(misses) if misses else math.nan,
                "hit_ttft_error_median": statistics.median(hits) if hits else math.nan,
                "ttft_error_max": max(errors, key=abs),
                "within_target": bool(misses) and abs(statistics.median(misses)) <= TTFT_TOLERANCE,
                "late_s": inst["late_s"] / d}


async def run_weights(plan: WeightsRunPlan, *, kill_role: str | None = None, kill_after_s: float = 0.0,
                      timeout_s: float | None = None) -> WeightsReport:
    """Start the store and the instance, run the cold start and the requests, collect both results. `kill_role`
    is SIGKILLed `kill_after_s` after the start (the dead-peer test). Both are gone when this returns."""
    report = WeightsReport(plan)
    children: dict[str, Child] = {}
    link = {"rate_Bps": plan.rate_Bps, "latency_s": plan.latency_s, "plan": plan.role_plan()}
    try:
        for role in ("store", "instance"):
            children[role] = await spawn(role, "kvtransit.flows.weights", {"role": role, **link})
        port = (await children["store"].wait_ready(one_line=True))["listen_port"]
        await children["instance"].wait_ready(one_line=True)
        start_ns = time.monotonic_ns() + round(START_MARGIN_S * 1e9)
        await children["store"].send_go({})
        await children["instance"].send_go({"store": ["127.0.0.1", port], "start_ns": start_ns})
        expected = (pull_s(plan.model.resident_weight_bytes, plan.link) + plan.arrivals_s[-1]
                    + plan.requests * (pull_s(plan.shape.nbytes, plan.link) + plan.prefill_s))
        budget = timeout_s if timeout_s is not None else (
            START_MARGIN_S + expected * plan.dilation * 2 + 2 * plan.deadline_s + 10)
        report.results, report.failures = await run_roles(children, budget, "the weight flow", kill_role=kill_role,
                                                          kill_at_ns=start_ns + round(kill_after_s * 1e9))
    finally:
        await reap(children.values())
    return report
