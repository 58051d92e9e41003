"""`kvtransit select`: query-aware KV selection live, a pool, a module that scores and a decode host as three
processes over a shaped link (flows/selection/roles.py), measured beside the model (flows/selection/model.py).

Plan: the model's decode step for a remote context of `context` tokens, without selection (every token fetched, one
leg) or with it (the summaries' leg through the module, the host's ranking, the chosen pages' leg), plus the step's
compute at the context it attends to (model/cost/roofline.py: decode_step_s). Run: start the pool, the module and decode
(`python -m kvtransit.flows.selection`), read each one's readiness line, give the module the pool's address and
decode the module's and the start time, collect a result line from each, and compare the measured step and fetch
with the model's. Every child is killed by its pid at the end (harness/children.py).

Scale: the context is the real-KV sample's (flows/selection/context.py), each decode step reading one of its
decode queries over its 353-384 tokens, standing for the model's `context`: the effective scale is the ratio of
their KV bytes, the link's rate is scaled by it, and the model is also evaluated at the bytes each step actually
moved (a 24-page sample rounds a budget of 1/16 up to 2 pages, where the model's 2,048 pages take 128). Time is
dilated where the scaled rate is over model/kv_scale.py's HOST_BUDGET_BPS or a step is shorter than the host's
measured cost of one.

The scoring runs where the module's policy puts it (model/module/budget.py: budget_check): the mean key's 1.00 op/B of
MAC in transit (slowed where the budget is lower: 2.5x at 0.40); Quest's bound needs a max, refused unless `--policy
host` sends it to the host.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from kvtransit.flows.selection.context import LegError, RemoteContext
from kvtransit.flows.selection.model import DEFAULT_PAGE_SIZE, SelectionStep, check_budget, scoring_budget
from kvtransit.flows.selection.roles import SCORING_HOST, SCORING_TRANSIT
from kvtransit.harness.children import Child, reap, run_roles, spawn
from kvtransit.harness.host import HOST_HOP_S
from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.selection import evaluate_selection, group_scores, rank_pages
from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.roofline import decode_step_s
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import group_fidelity, model_gap
from kvtransit.model.kv_scale import HOST_BUDGET_BPS, host_dilation, resolve_dilation
from kvtransit.model.module.budget import Action, BudgetResult, Module, Policy

START_MARGIN_S = 1.0
MIN_DEADLINE_S = 5.0
DEADLINE_STEPS = 5
HOST_TIMING_REPEATS = 3
LEGS_PER_STEP = 4  # with selection: query, summaries, fetch, pages (each a hop through the module)
PROCESSES = 3


@dataclass(frozen=True)
class SelectionRunPlan:
    model: ModelSpec
    device: Device
    link: Link
    context: int
    budget: float | None
    kind: str
    page_size: int
    precision_bits: int | None
    sink_pages: int
    steps: int
    scoring: str  # transit | host | - (no selection)
    budget_check: BudgetResult | None
    module: Module
    modelled: SelectionStep
    model_fetch_s: float
    model_compute_s: float
    sample: str
    text: str
    wire_dtype: str
    effective_scale: float
    host_step_s: float  # measured: one step's payloads, scoring and ranking on this host
    dilation: float
    dilation_why: str
    rate_Bps: float
    latency_s: float
    deadline_s: float

    @property
    def model_step_s(self) -> float:
        return self.model_fetch_s + self.model_compute_s

    def role_plan(self) -> dict[str, Any]:
        transit = self.scoring == SCORING_TRANSIT
        occupancy = (self.budget_check.charged_ops_per_byte / self.module.ops_per_byte
                     if transit and self.budget_check else 0.0)
        return {"sample": self.sample, "text": self.text, "page_size": self.page_size, "kind": self.kind,
                "budget": self.budget, "steps": self.steps, "compute_s": self.model_compute_s * self.dilation,
                "scoring": self.scoring if self.budget is not None else SCORING_TRANSIT,
                "precision_bits": self.precision_bits, "sink_pages": self.sink_pages, "wire_dtype": self.wire_dtype,
                "module_occupancy": occupancy,
                "module_latency_s": self.module.added_latency_s * self.dilation if transit else 0.0,
                "deadline_s": self.deadline_s}

    def fetch_at_bytes_s(self, summary_bytes: float, page_bytes: float) -> float:
        """The model's fetch (flows/selection/model.py: fetch_time_s's legs) at bytes measured at scale."""
        link, scale = self.link, self.effective_scale
        pages = 2 * link.latency_s + page_bytes / scale / link.bandwidth_Bps
        if self.budget is None:
            return pages
        wire = summary_bytes / scale / link.bandwidth_Bps
        summaries = 2 * link.latency_s + wire
        if self.scoring == SCORING_TRANSIT and self.budget_check is not None:
            compute = wire * self.budget_check.charged_ops_per_byte / self.module.ops_per_byte
            summaries = 2 * link.latency_s + self.module.added_latency_s + max(wire, compute)
        return summaries + pages


def measure_host_step_s(ctx: RemoteContext, budget: float | None, kind: str, precision_bits: int | None,
                        sink_pages: int, repeats: int = HOST_TIMING_REPEATS) -> float:
    """What one decode step's payloads cost this host (the pool's summaries and pages, the scores, the ranking):
    the median of `repeats`, step 0."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ids = None
        if budget is not None:
            ctx.summary_bytes(0, kind)
            ids = rank_pages(group_scores(ctx.query(0), ctx.summaries(0, kind), precision_bits), budget, sink_pages)
        ctx.pages_payload(0, ids).tobytes()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def plan_selection(model: ModelSpec, device: Device, link: Link, *, context: int, sample: str,
                   budget: float | None = 1 / 16, kind: str = "mean", page_size: int = DEFAULT_PAGE_SIZE,
                   precision_bits: int | None = None, sink_pages: int = 0, module: Module = Module(),
                   policy: Policy = Policy.REJECT, steps: int = 8, dilation: float | str = "auto",
                   text: str = "prose", wire_dtype: str = "float16", cores: int | None = None) -> SelectionRunPlan:
    """A decode step over a remote `context`, selecting ⌈budget × pages⌉ pages (None: fetching everything)."""
    if budget is not None:
        check_budget(budget)
    if steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    if sink_pages < 0:
        raise ConfigError(f"--sink-pages must be >= 0, got {sink_pages}")
    modelled = SelectionStep(model, context, budget, kind, page_size)  # checks the context, page size and kind
    try:
        ctx = RemoteContext.load(sample, text, page_size, wire_dtype)
    except (LegError, KernelInputError, OSError) as exc:
        raise ConfigError(f"the remote context: {exc}") from None
    verdict: BudgetResult | None = None
    scoring = "-"
    if budget is not None:
        verdict = scoring_budget(model, kind, module, policy)
        if verdict.action is Action.REJECTED:
            raise ConfigError(f"scoring {kind} summaries: {verdict.describe()}; --policy host scores them at the "
                              "decode host (valid: --policy reject|host)")
        scoring = SCORING_TRANSIT if verdict.action is Action.IN_TRANSIT else SCORING_HOST
    model_fetch = modelled.fetch_time_s(link, module if scoring == SCORING_TRANSIT else None)
    attended = context if budget is None else modelled.chosen_pages * page_size + modelled.tail_tokens
    compute = decode_step_s(model, device, 1, 1, attended)
    scale = ctx.tokens * ctx.kv_bytes_per_token() / modelled.all_kv_bytes
    host_step = measure_host_step_s(ctx, budget, kind, precision_bits, sink_pages)
    cores = cores or os.cpu_count() or 1
    legs = LEGS_PER_STEP if budget is not None else 2
    floor = (host_step + legs * HOST_HOP_S) * max(1.0, PROCESSES / cores)
    rate = link.bandwidth_Bps * scale
    auto = host_dilation(model_fetch + compute, floor, rate)
    dilation, why = resolve_dilation(dilation, auto)
    if why == "auto":
        why = (f"auto: a modelled step of {(model_fetch + compute) * 1e3:,.2f} ms against the host's "
               f"{floor * 1e3:,.2f} ms a step (its payloads and scoring {host_step * 1e3:,.2f} ms, measured), and "
               f"{rate / 1e6:,.1f} MB/s of scaled link against {HOST_BUDGET_BPS / 1e6:g} MB/s")
    return SelectionRunPlan(
        model, device, link, context, budget, kind, page_size, precision_bits, sink_pages, steps, scoring, verdict,
        module, modelled, model_fetch, compute, sample, text, wire_dtype, scale, host_step, dilation, why,
        rate / dilation, link.latency_s * dilation,
        max(MIN_DEADLINE_S, DEADLINE_STEPS * (model_fetch + compute) * dilation))


@dataclass
class SelectionReport:
    plan: SelectionRunPlan
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # by role
    failures: list[str] = field(default_factory=list)
    offline: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.results) == PROCESSES and all(r["ok"] for r in self.results.values())

    def summary(self) -> dict[str, Any]:
        p, d = self.plan, self.plan.dilation
        decode = self.results.get("decode") if self.ok else None
        steady = slice(1, None) if p.steps > 1 else slice(None)
        summaries = statistics.fmean(decode["summary_bytes"][steady]) if decode else math.nan
        pages = statistics.fmean(decode["page_bytes"][steady]) if decode else math.nan
        at_bytes = p.fetch_at_bytes_s(summaries, pages) if decode else math.nan
        step = decode["step_median_s"] / d if decode else math.nan
        fetch = decode["fetch_median_s"] / d if decode else math.nan
        model_step_at_bytes = at_bytes + p.model_compute_s
        return {
            "model": p.model.name, "device": p.device.name, "link": p.link.name, "context": p.context,
            "select": "all" if p.budget is None else "top-k", "budget": p.budget, "kind": p.kind,
            "page_size": p.page_size, "precision_bits": p.precision_bits, "sink_pages": p.sink_pages,
            "scoring": p.scoring, "budget_check": p.budget_check.describe() if p.budget_check else None,
            "steps": p.steps, "kv": f"{p.sample} ({p.text}): 353-384 tokens stand for {p.context:,}",
            "scale": p.effective_scale, "dilation": d, "dilation_why": p.dilation_why,
            "model_fetched_bytes": p.modelled.fetched_bytes, "model_fetch_s": p.model_fetch_s,
            "model_compute_s": p.model_compute_s, "model_step_s": p.model_step_s,
            "measured_summary_bytes": summaries / p.effective_scale if decode else math.nan,
            "measured_page_bytes": pages / p.effective_scale if decode else math.nan,
            "model_fetch_at_measured_bytes_s": at_bytes, "model_step_at_measured_bytes_s": model_step_at_bytes,
            "measured_fetch_s": fetch, "measured_step_s": step,
            "step_error": step / model_step_at_bytes - 1 if decode else math.nan,
            "chosen_pages": statistics.fmean(decode["chosen_pages"]) if decode else math.nan,
            "late_s": decode["late_s"] if decode else math.nan,
            "accuracy": decode.get("accuracy") if decode else None, "offline": self.offline,
            "module": self.results.get("scorer"), "pool": self.results.get("pool"),
            "ok": self.ok, "failures": self.failures,
            **group_fidelity(self.ok, self.failures,
                             {"step": model_gap(step, model_step_at_bytes, d, "the decode step")}),
        }


def offline_selection(plan: SelectionRunPlan) -> dict[str, Any] | None:
    """The same selection measured offline on the sample (kernels/selection.py: evaluate_selection), over the
    decode queries the run's steps read; None without selection."""
    if plan.budget is None:
        return None
    ctx = RemoteContext.load(plan.sample, plan.text, plan.page_size, plan.wire_dtype)
    s = ctx.sample
    assert s.q is not None and s.q_positions is not None
    steps = sorted({step % s.q_positions.size for step in range(plan.steps)})
    quality = evaluate_selection(s.q[:, :, steps], s.k, s.v, s.q_positions[steps], plan.budget, kind=plan.kind,
                                 page_size=plan.page_size, precision_bits=plan.precision_bits,
                                 sink_pages=plan.sink_pages)
    return {"recall": quality.recall, "output_error": quality.output_error}


async def run_selection(plan: SelectionRunPlan, *, kill_role: str | None = None, kill_after_s: float = 0.0,
                        timeout_s: float | None = None) -> SelectionReport:
    """Start the pool, the module and decode, run the steps, collect every result. `kill_role` is SIGKILLed
    `kill_after_s` after the first step starts (the dead-peer test). Every child is gone when this returns."""
    report = SelectionReport(plan)
    children: dict[str, Child] = {}
    link = {"rate_Bps": plan.rate_Bps, "latency_s": plan.latency_s, "plan": plan.role_plan()}
    try:
        for role in ("pool", "scorer", "decode"):
            children[role] = await spawn(role, "kvtransit.flows.selection", {"role": role, **link})
        ports = {role: (await child.wait_ready(one_line=True))["listen_port"] for role, child in children.items()}
        start_ns = time.monotonic_ns() + round(START_MARGIN_S * 1e9)
        await children["pool"].send_go({})
        await children["scorer"].send_go({"pool": ["127.0.0.1", ports["pool"]]})
        await children["decode"].send_go({"scorer": ["127.0.0.1", ports["scorer"]], "start_ns": start_ns})
        budget = timeout_s if timeout_s is not None else (
            START_MARGIN_S + plan.steps * plan.model_step_s * plan.dilation * 3 + 2 * plan.deadline_s + 10)
        report.results, report.failures = await run_roles(children, budget, "the selection run", kill_role=kill_role,
                                                          kill_at_ns=start_ns + round(kill_after_s * 1e9))
    finally:
        await reap(children.values())
    return report
