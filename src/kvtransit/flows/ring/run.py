"""`kvtransit ring`: ring attention as n rank processes passing real KV blocks round a shaped ring.

Plan (arithmetic over flows/ring/model.py): the model's hop (link leg, blockwise attention, whichever is longer) for a
prompt of `context` tokens split into n blocks, and what each rank holds and sends at the run's scale and
dilation. Run: start the n ranks (`python -m kvtransit.flows.ring`), read each one's readiness line, tell each
its next rank and the group's start time, collect one result line from each, and compare the measured prompt
and hop with the model's. Every child is killed by its pid at the end, on error and on a timeout
(harness/children.py).

Scale: the blocks are the real-KV sample's (flows/ring/blocks.py), so a hop's bytes are a sample block's (e.g.
96 tokens × 3 kv heads × 64 for n = 4) standing for the model's block (e.g. 8,192 tokens × 8 × 128): the
*effective* scale is their ratio, and the link's rate is scaled by it, as a collective's is
(flows/tp/run.py). Time is dilated where one hop is shorter than this host can carry (`dilation
"auto"`: what a hop costs the host, measured here with the codec, × ranks a core) or the scaled rate is over
model/kv_scale.py's HOST_BUDGET_BPS.

A codec on the ring's links runs where the module's policy puts it (model/module/budget.py: budget_check): in transit
(the module's latency, and its compute bound when transit-bound, held on the link) or, for a kernel the module
may not run, at the GPUs with `--policy host` (the wire bytes only; the GPU's cast is not held: one op a value).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

from kvtransit.flows.ring.blocks import BlockError, LinkCodec, RingKV
from kvtransit.flows.ring.model import Hop, block_bytes, hop, hops_per_layer
from kvtransit.harness.children import Child, collect_results, reap, sorted_results, spawn
from kvtransit.harness.host import HOST_HOP_S, PROCESSES_PER_CORE
from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.ring_attention import error_after_hops, wire_codec
from kvtransit.model.catalog.codecs import CODEC_NAMES, codec_declaration
from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import group_fidelity, model_gap
from kvtransit.model.kv_scale import HOST_BUDGET_BPS, host_dilation, resolve_dilation
from kvtransit.model.module.budget import Action, BudgetResult, KernelDeclaration, Module, Policy, budget_check

GROUP_ID = 1
START_MARGIN_S = 1.0  # after the last rank's readiness: time to dial the ring
MIN_DEADLINE_S = 5.0
DEADLINE_PROMPTS = 5  # a rank silent for this many modelled prompts fails the prompt (never hangs)
CODEC_TIMING_REPEATS = 5
RUNS_ON_TRANSIT, RUNS_ON_GPU, RUNS_NOWHERE = "transit", "gpu", "-"


@dataclass(frozen=True)
class RingPlan:
    model: ModelSpec
    device: Device
    link: Link
    n: int
    context: int
    block_tokens: int  # the model's block: context / n
    prompts: int
    codec: str
    codec_params: dict[str, Any]
    runs_on: str  # transit | gpu | -
    budget: BudgetResult | None
    declaration: KernelDeclaration
    modelled: Hop  # the model's hop, dilation 1, at the declared ratio
    sample: str
    text: str
    wire_dtype: str
    sample_block_tokens: int
    sample_block_bytes: int  # one layer's block, uncoded, on the wire
    effective_scale: float  # sample block bytes / the model's block bytes
    host_codec_s: float  # measured here: one block encoded and decoded
    dilation: float
    dilation_why: str
    rate_Bps: float  # the link at scale and dilation
    latency_s: float  # × dilation
    compute_s: float  # the hop's blockwise attention, × dilation
    module: Module
    deadline_s: float
    query_rank: int | None

    @property
    def model_layer_s(self) -> float:
        return self.modelled.compute_s + hops_per_layer(self.n) * self.modelled.total_s

    @property
    def model_prompt_s(self) -> float:
        return self.model.layers * self.model_layer_s

    def hop_at_ratio(self, ratio: float) -> Hop:
        """The model's hop with the wire at `ratio` (the ratio measured on the sample's blocks)."""
        if self.runs_on == RUNS_ON_TRANSIT:
            return hop(self.model, self.device, self.link, self.block_tokens,
                       kernel=replace(self.declaration, ratio=ratio), module=self.module)
        return hop(self.model, self.device, self.link, self.block_tokens, ratio=ratio)

    def rank_plan(self, rank: int) -> dict[str, Any]:
        transit = self.runs_on == RUNS_ON_TRANSIT
        occupancy = (self.declaration.charged_ops_per_byte / self.module.ops_per_byte) if transit else 0.0
        return {"group": GROUP_ID, "rank": rank, "size": self.n, "layers": self.model.layers,
                "prompts": self.prompts, "compute_s": self.compute_s, "sample": self.sample, "text": self.text,
                "codec": self.codec, "codec_params": self.codec_params, "wire_dtype": self.wire_dtype,
                "module_occupancy": occupancy,
                "module_latency_s": self.module.added_latency_s * self.dilation if transit else 0.0,
                "deadline_s": self.deadline_s}


def _codec_declaration(codec: str, params: dict[str, Any], transform_charged: bool) -> KernelDeclaration:
    if codec not in CODEC_NAMES:
        raise ConfigError(f"unknown codec {codec!r} (choose from: {', '.join(CODEC_NAMES)})")
    if codec == "freq-keep-k":
        decl = codec_declaration(codec, keep=params.get("keep", 0.5), transform_length=params.get("block", 64))
        # The FFT is passive optics (free) unless charged, as `kvtransit up --transform-charged` charges it.
        return replace(decl, precision_bits=params.get("precision_bits"), transform_charged=transform_charged)
    return codec_declaration(codec)


def _place(decl: KernelDeclaration, module: Module, policy: Policy) -> tuple[str, BudgetResult | None]:
    if decl.name == "none":
        return RUNS_NOWHERE, None
    verdict = budget_check(decl, module, policy)
    if verdict.action is Action.REJECTED:
        raise ConfigError(f"codec {decl.name} on the ring's links: {verdict.describe()}; --policy host runs it at "
                          "the GPUs (valid: --policy reject|host)")
    return (RUNS_ON_TRANSIT if verdict.action is Action.IN_TRANSIT else RUNS_ON_GPU), verdict


def measure_codec_s(kv: RingKV, codec: LinkCodec, repeats: int = CODEC_TIMING_REPEATS) -> float:
    """What one hop's kernel costs this host (a block encoded, then decoded): the median of `repeats`."""
    block = kv.block(0, 0)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        codec.decode(codec.encode(block, 1), block.shape)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def plan_ring(model: ModelSpec, device: Device, link: Link, *, n: int, context: int, sample: str,
              text: str = "prose", codec: str = "none", codec_params: dict[str, Any] | None = None,
              module: Module = Module(), policy: Policy = Policy.REJECT, prompts: int = 3,
              dilation: float | str = "auto", wire_dtype: str = "bfloat16", transform_charged: bool = False,
              cores: int | None = None) -> RingPlan:
    """Ring attention of one `context`-token prompt on n ranks over `link`, a `codec` on every hop."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"a ring needs n >= 2 ranks (e.g. 2, 4, 8), got {n!r}")
    cores = cores or os.cpu_count() or 1
    if n > PROCESSES_PER_CORE * cores:
        raise ConfigError(f"a ring of {n} needs {n} processes; this host has {cores} cores "
                          f"(valid: up to {PROCESSES_PER_CORE * cores} ranks)")
    if context < n or context % n:
        raise ConfigError(f"--context {context} does not split into {n} equal blocks (valid: a multiple of {n})")
    if prompts < 1:
        raise ConfigError(f"--prompts must be >= 1, got {prompts}")
    params = dict(codec_params or {})
    decl = _codec_declaration(codec, params, transform_charged)
    runs_on, verdict = _place(decl, module, policy)
    try:
        kv = RingKV.load(sample, text, n)
        link_codec = LinkCodec(codec, params, wire_dtype)
    except (BlockError, KernelInputError, OSError) as exc:
        raise ConfigError(f"ring attention's KV: {exc}") from None
    block_tokens = context // n
    modelled = (hop(model, device, link, block_tokens, kernel=decl, module=module) if runs_on == RUNS_ON_TRANSIT
                else hop(model, device, link, block_tokens, ratio=decl.ratio))
    sample_bytes = kv.raw_bytes(link_codec.wire.itemsize)
    scale = sample_bytes / block_bytes(model, block_tokens)
    host_codec_s = measure_codec_s(kv, link_codec)
    floor_s = (HOST_HOP_S + host_codec_s) * max(1.0, n / cores)
    rate = link.bandwidth_Bps * scale
    auto = host_dilation(modelled.total_s, floor_s, rate)
    dilation, why = resolve_dilation(dilation, auto)
    if why == "auto":
        why = (f"auto: a modelled hop of {modelled.total_s * 1e6:,.0f} µs against the host's "
               f"{floor_s * 1e6:,.0f} µs a hop (its kernel {host_codec_s * 1e6:,.0f} µs, measured), and "
               f"{rate / 1e6:,.1f} MB/s of scaled link against {HOST_BUDGET_BPS / 1e6:g} MB/s")
    prompt_s = model.layers * (modelled.compute_s + hops_per_layer(n) * modelled.total_s)
    return RingPlan(
        model, device, link, n, context, block_tokens, prompts, codec, params, runs_on, verdict, decl, modelled,
        sample, text, wire_dtype, kv.block_tokens, sample_bytes, scale, host_codec_s, dilation, why,
        rate / dilation, link.latency_s * dilation, modelled.compute_s * dilation, module,
        max(MIN_DEADLINE_S, DEADLINE_PROMPTS * prompt_s * dilation), kv.query_rank())


@dataclass
class RingReport:
    plan: RingPlan
    ranks: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    offline: dict[str, Any] | None = None  # the same codec's error measured offline (kernels/ring_attention.py)

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.ranks) == self.plan.n and all(r["ok"] for r in self.ranks)

    def summary(self) -> dict[str, Any]:
        p, d = self.plan, self.plan.dilation
        ok_ranks = [r for r in self.ranks if r["ok"]]
        count = min((len(r["prompt_s"]) for r in ok_ranks), default=0)
        first = 1 if count > 1 else 0  # the first prompt is a warm-up when there are more
        # The group's prompt is its slowest rank's; prompts run on absolute deadlines, so the mean is the rate.
        prompts = [max(r["prompt_s"][k] for r in ok_ranks) / d for k in range(first, count)] if self.ok else []
        hops = [r["hop_median_s"] / d for r in ok_ranks if not math.isnan(r["hop_median_s"])]
        raw = sum(r["raw_bytes"] for r in ok_ranks)
        wire = sum(r["wire_bytes"] for r in ok_ranks)
        ratio = raw / wire if wire else math.nan
        # Codec none adds its few bytes of header to a block (ratio 0.9996): the model's raw hop is the one.
        at_measured = (None if not self.ok else p.modelled if p.codec == "none" or not ratio >= 1
                       else p.hop_at_ratio(ratio))
        measured_prompt = statistics.fmean(prompts) if prompts else math.nan
        model_at_measured = (p.model.layers * (at_measured.compute_s + hops_per_layer(p.n) * at_measured.total_s)
                             if at_measured else math.nan)
        accuracy = next((r["accuracy"] for r in ok_ranks if r.get("accuracy")), None)
        return {
            "model": p.model.name, "device": p.device.name, "link": p.link.name, "n": p.n, "context": p.context,
            "block_tokens": p.block_tokens, "layers": p.model.layers, "prompts": p.prompts,
            "codec": p.codec, "codec_params": p.codec_params, "runs_on": p.runs_on,
            "budget": p.budget.describe() if p.budget else None, "wire_dtype": p.wire_dtype,
            "kv": f"{p.sample} ({p.text}): blocks of {p.sample_block_tokens} tokens stand for {p.block_tokens:,}",
            "scale": p.effective_scale, "dilation": d, "dilation_why": p.dilation_why,
            "host_codec_s": p.host_codec_s,
            "model_hop_link_s": p.modelled.link_s, "model_hop_compute_s": p.modelled.compute_s,
            "model_hop_s": p.modelled.total_s, "model_link_bound": p.modelled.link_bound,
            "model_layer_s": p.model_layer_s, "model_prompt_s": p.model_prompt_s,
            "declared_ratio": p.declaration.ratio, "measured_ratio": ratio,
            "model_hop_at_measured_ratio_s": at_measured.total_s if at_measured else math.nan,
            "model_prompt_at_measured_ratio_s": model_at_measured,
            "measured_hop_s": statistics.median(hops) if hops else math.nan,
            "measured_prompt_s": measured_prompt,
            "prompt_error": measured_prompt / model_at_measured - 1 if prompts and at_measured else math.nan,
            "hops_per_layer": ([r["hops"] / (p.model.layers * p.prompts) for r in ok_ranks] if self.ok else []),
            "late_s": max((r.get("late_s", 0.0) for r in self.ranks), default=0.0),
            "accuracy": accuracy, "offline": self.offline,
            "ok": self.ok, "failures": self.failures,
            **group_fidelity(self.ok, self.failures,
                             {"prompt": model_gap(measured_prompt, model_at_measured, d, "the prompt")}),
        }


def offline_errors(plan: RingPlan) -> dict[str, Any] | None:
    """The codec's attention-output error measured offline on the same blocks (kernels/ring_attention.py): after
    one pass, after n − 1 hops, and the ring's; None for codec none (nothing to accumulate)."""
    if plan.codec == "none":
        return None
    kv = RingKV.load(plan.sample, plan.text, plan.n)
    s = kv.sample
    assert s.q is not None and s.q_positions is not None
    errors = error_after_hops(s.q, s.q_positions, s.k, s.v, plan.n,
                              wire_codec(plan.codec, plan.wire_dtype, **plan.codec_params))
    return {"one_pass": errors.one_pass, "after_n_minus_1_hops": errors.after_hops[-1], "ring": errors.ring}


async def run_ring(plan: RingPlan, *, kill_rank: int | None = None, kill_after_s: float = 0.0,
                   timeout_s: float | None = None) -> RingReport:
    """Start the ring, run its prompts, collect every result. `kill_rank` is SIGKILLed `kill_after_s` after the
    first prompt starts (the dead-rank test). Every child is gone when this returns."""
    report = RingReport(plan)
    ranks: list[Child] = []
    link = {"rate_Bps": plan.rate_Bps, "latency_s": plan.latency_s}
    try:
        for r in range(plan.n):
            ranks.append(await spawn(f"rank {r}", "kvtransit.flows.ring", {"plan": plan.rank_plan(r), **link}))
        ports = [(await rank.wait_ready(one_line=True))["listen_port"] for rank in ranks]
        start_ns = time.monotonic_ns() + round(START_MARGIN_S * 1e9)
        for r, rank in enumerate(ranks):
            await rank.send_go({"start_ns": start_ns, "next": ["127.0.0.1", ports[(r + 1) % plan.n]]})
        budget = timeout_s if timeout_s is not None else (
            START_MARGIN_S + plan.prompts * plan.model_prompt_s * plan.dilation * 3 + 2 * plan.deadline_s + 10)
        results = await collect_results(ranks, budget, kill=None if kill_rank is None else ranks[kill_rank],
                                        kill_at_ns=start_ns + round(kill_after_s * 1e9))
        report.ranks, report.failures = sorted_results(ranks, results)
    except TimeoutError:
        report.failures.append("the ring did not finish within its time budget")
    finally:
        await reap(ranks)
    return report
