"""Query-aware selection's row of the candidate table: `kvtransit select`, a pool, the module scoring the pages'
summaries in transit and decode over a shaped link, top-k and every token; the every-token fetch's measured share of
its step, the error of what arrived (its attention output against the equal-bytes quantiser's: no task-level loss of
page selection has been measured on the real model). Regime: remote context × page budget, the share by
flows/selection/model.py and the precision at each budget measured offline on the real-KV sample
(kernels/selection.py: evaluate_selection, the figure the live row's decode measures)."""

from __future__ import annotations

import asyncio
import functools
import json
import math
from typing import Any

from kvtransit.harness.studies.candidates.rows import (
    SAMPLE_TEXT,
    DeckVerdict,
    Row,
    RowContext,
    RowRun,
    budget_flag,
    faithful_runs,
    links,
    relative_l2,
    small_report,
)
from kvtransit.harness.studies.candidates.table import LINE_INPUT, PROMISING, Candidate, PrecisionFigure, RowMeasured
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE

# Query-aware selection as the offline row had it: a 32k-token remote context of llama3-8b, a quarter of the pages
# (Quest's usual budget; docs/results/selection.md's 1/4 row) with the sink page kept, mean keys scored in transit,
# beside the every-token baseline; 5 decode steps, the first a warm-up.
SELECTION_RUN: dict[str, Any] = dict(model="llama3-8b", context=32768, budget=0.25, sink_pages=1, steps=5)
# The regime's grid: remote contexts from 4k to 128k tokens (llama3's window) × the budgets docs/results/selection.md
# measured (1/4, 1/8, 1/16 of the pages).
CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)
BUDGETS = (0.25, 0.125, 0.0625)


def _settings(ctx: RowContext) -> tuple[int, float]:
    return int(ctx.setting("context", SELECTION_RUN["context"])), float(ctx.setting("budget", SELECTION_RUN["budget"]))


def _selection(ctx: RowContext, budget: float | None) -> tuple[Any, dict[str, Any]]:
    from kvtransit.flows.selection.run import offline_selection, plan_selection, run_selection
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.module.budget import Module

    u = ctx.unknowns
    plan = plan_selection(model_by_name(SELECTION_RUN["model"]), device_by_name("h100"), link_by_name(ctx.link),
                          context=_settings(ctx)[0], sample=str(ctx.sample_path), text=SAMPLE_TEXT,
                          budget=budget, sink_pages=SELECTION_RUN["sink_pages"], precision_bits=u.precision_bits,
                          module=Module(ops_per_byte=u.module_budget), steps=SELECTION_RUN["steps"])
    report = asyncio.run(run_selection(plan))
    report.offline = offline_selection(plan)
    summary = report.summary()
    name = "all" if budget is None else "top-k"
    (ctx.run_dir / f"select-{name}.json").write_text(json.dumps(summary, indent=1, default=str))
    return report, summary


def _selection_command(ctx: RowContext) -> str:
    u = ctx.unknowns
    bits = "" if u.precision_bits is None else f" --precision-bits {u.precision_bits}"
    context, budget = _settings(ctx)
    return (f"kvtransit select --model {SELECTION_RUN['model']} --remote-context {context} "
            f"--link {ctx.link} --select-budget {budget:g} --sink-pages {SELECTION_RUN['sink_pages']} "
            f"--steps {SELECTION_RUN['steps']}{bits} {budget_flag(u.module_budget)} --json")


def row_query_aware_selection(ctx: RowContext) -> RowRun:
    from kvtransit.flows.selection.model import SelectionStep, scoring_declaration
    from kvtransit.model.judge.five_tests import equal_bytes_baseline

    top_report, top = _selection(ctx, _settings(ctx)[1])
    all_report, everything = _selection(ctx, None)
    plan = all_report.plan
    model, context = plan.model, plan.context
    # Measured: the every-token fetch's share of its decode step (the step's compute held at the model's time).
    share = (everything["measured_fetch_s"] / everything["measured_step_s"]
             if all_report.ok and math.isfinite(everything["measured_step_s"]) else None)
    step_s = plan.model_compute_s

    def share_on(link: Any) -> float:
        fetch = SelectionStep(model, context).fetch_time_s(link)
        return fetch / (fetch + step_s)

    budget = _settings(ctx)[1]
    ratio = SelectionStep(model, context, budget).reduction
    baseline = equal_bytes_baseline(ratio)
    base_err = _baseline_error(str(ctx.sample_path), baseline)
    acc = top.get("accuracy") or {}
    row = RowMeasured(
        ctx.name, scoring_declaration(model, "mean"), share,
        f"the every-token fetch's share of its decode step (fetch / step), {model.name} at {context:,} tokens",
        share_by_link={name: share_on(link) for name, link in links().items()}, link=ctx.link,
        link_bytes=float(SelectionStep(model, context).all_kv_bytes), share_whole="a decode step", line=LINE_INPUT,
        budget_ops_per_byte=ctx.unknowns.module_budget,
        precision=PrecisionFigure(acc.get("output_error") if top_report.ok else None, base_err,
                                  f"attention-output error of what arrived, budget {budget:g} of the "
                                  f"pages (sink page kept) vs {baseline} at equal bytes (ratio {ratio:.2f})",
                                  at_bits=ctx.unknowns.precision_bits),
        streams=1.0 if top_report.ok else None, streams_as="streams scored (one context's summaries)",
        streams_counted=False, compute_basis="modelled: the h100 roofline's decode step, held on the clock",
        notes=(("precision: no task-level loss of page selection is measured on the real model "
                "(docs/results/accuracy.json has codecs only): the attention output of what arrived against the "
                "equal-bytes quantiser's on the same real KV"),))
    effect = (everything["measured_step_s"] / top["measured_step_s"]
              if top_report.ok and all_report.ok else math.nan)
    return RowRun(row, top["scale"], max(top["dilation"], everything["dilation"]),
                  faithful_runs({"top-k": top, "every token": everything}), _selection_command(ctx), str(ctx.run_dir),
                  measured_what="the every-token and the top-k decode steps (a pool, the module scoring the "
                                "summaries in transit, decode ranking and fetching, over a shaped link), the recall "
                                "and output error of what arrived",
                  modelled_what="the decode step's compute held on the clock (model/cost/roofline.py) and the share on "
                                "other links (flips); the equal-bytes baseline's error offline on the same sample",
                  extra={"recall": acc.get("recall"), "output_error": acc.get("output_error"), "baseline": baseline,
                         "baseline_error": base_err, "reduction": ratio, "step_ratio": effect,
                         "all_step_s": everything["measured_step_s"], "top_k_step_s": top["measured_step_s"]},
                  evidence={"top-k": small_report(top), "every token": small_report(everything)})


@functools.lru_cache(maxsize=8)
def _baseline_error(sample: str, baseline: str) -> float:
    """The equal-bytes quantiser's attention-output error on the real-KV sample (full attention, float64)."""
    from kvtransit.kernels.accuracy import load_sample
    from kvtransit.kernels.ring_attention import full_attention, wire_codec

    kv = load_sample(sample)[SAMPLE_TEXT]
    q, k, v, pos = kv.q, kv.k, kv.v, kv.q_positions
    assert q is not None and pos is not None  # the sample's prose carries its decode queries
    codec = wire_codec(baseline)
    return relative_l2(full_attention(q, pos, k, v), full_attention(q, pos, codec(k, 0), codec(v, 0)))


@functools.lru_cache(maxsize=16)
def _selection_error(sample: str, budget: float, bits: int | None) -> float:
    """The attention-output error of what a `budget` selection keeps (sink page kept), over the decode queries the
    live row's steps read (flows/selection/run.py: offline_selection's), on the real-KV sample."""
    from kvtransit.flows.selection.context import RemoteContext
    from kvtransit.kernels.selection import evaluate_selection

    s = RemoteContext.load(sample, SAMPLE_TEXT, 16, "float16").sample
    assert s.q is not None and s.q_positions is not None
    steps = sorted({step % s.q_positions.size for step in range(SELECTION_RUN["steps"])})
    quality = evaluate_selection(s.q[:, :, steps], s.k, s.v, s.q_positions[steps], budget, kind="mean",
                                 page_size=16, precision_bits=bits, sink_pages=SELECTION_RUN["sink_pages"])
    return float(quality.output_error)


def _selection_model(ctx: RowContext, _own: RowRun, context: int, budget: float) -> Any:
    """The every-token fetch's share of its decode step at `context` on the row's link (flows/selection/model.py),
    and whether a `budget` selection's error is within the equal-bytes quantiser's (measured offline)."""
    from kvtransit.flows.selection.model import SelectionStep
    from kvtransit.harness.studies.candidates.regimes import PointModel
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.cost.roofline import decode_step_s
    from kvtransit.model.judge.five_tests import equal_bytes_baseline

    model = model_by_name(SELECTION_RUN["model"])
    fetch = SelectionStep(model, context).fetch_time_s(link_by_name(ctx.link))
    share = fetch / (fetch + decode_step_s(model, device_by_name("h100"), 1, 1, context))
    ratio = SelectionStep(model, context, budget).reduction
    error = _selection_error(str(ctx.sample_path), budget, ctx.unknowns.precision_bits)
    tolerance = _baseline_error(str(ctx.sample_path), equal_bytes_baseline(ratio))
    return PointModel(share, {"bottleneck": share >= BOTTLENECK_MIN_SHARE, "precision": error <= tolerance},
                      f"error {error:.3g} vs {tolerance:.3g}")


def _selection_regime() -> Any:
    from kvtransit.harness.studies.candidates.regimes import Axis, Regime

    return Regime(Axis("context", "remote context (tokens)", CONTEXTS, "tokens"),
                  Axis("budget", "page budget", BUDGETS, "of the pages", fraction=True), _selection_model,
                  "flows/selection/model.py's every-token fetch over the row's link against the roofline's decode "
                  "step; each budget's output error measured offline on the real-KV sample against the equal-bytes "
                  "quantiser's", home=lambda ctx: _settings(ctx), varies=("bottleneck", "precision"))


def scoring_case(event: str, model_name: str, context: int, budget: float, link_name: str) -> Any:
    """A decode step's page scoring (flows/selection/model.py: SelectionStep): the summaries scored in transit on
    their way to decode, by decode's GPU after they crossed, or by it over the next faster link; the chosen pages
    follow in each."""
    from kvtransit.flows.selection.model import SelectionStep, scoring_declaration
    from kvtransit.harness.studies.candidates.spec import DEVICE, SpecCase, next_faster
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.cost.energy import gpu_energy_j, link_energy_j
    from kvtransit.model.cost.roofline import StepWork, step_time
    from kvtransit.model.module.budget import Module

    model, device, link = model_by_name(model_name), device_by_name(DEVICE), link_by_name(link_name)
    step = SelectionStep(model, context, budget)
    decl = scoring_declaration(model, "mean")
    work = StepWork(float(step.summary_bytes * decl.ops_per_byte), float(step.summary_bytes))
    t = step_time(work, device, 1)
    gpu_score_s = max(t.compute_s, t.memory_s)
    gpu_score_j = gpu_energy_j(device, work.flops, work.hbm_bytes)
    wire = float(step.query_bytes + step.summary_bytes + step.chosen_kv_bytes)
    faster_name = next_faster(link_name)
    faster = link_by_name(faster_name) if faster_name else None

    def transit_s(b: float, latency_s: float) -> float:
        return step.fetch_time_s(link, Module(ops_per_byte=b, added_latency_s=latency_s))

    def transit_j(pj: float) -> float:
        return link_energy_j(link, wire) + Module(pj_per_input_bit=pj).energy_j(step.summary_bytes)

    return SpecCase(event, link_name, decl.name, 1.0, decl.charged_ops_per_byte, tuple(sorted(decl.unpublished_ops)),
                    transit_s, transit_j, step.fetch_time_s(link) + gpu_score_s,
                    link_energy_j(link, wire) + gpu_score_j,
                    "the summaries scored by decode's GPU after they crossed", faster_name,
                    None if faster is None else step.fetch_time_s(faster) + gpu_score_s,
                    None if faster is None else link_energy_j(faster, wire) + gpu_score_j,
                    ">= 6 (scores at 6-8 bits rank as at full precision: docs/results/selection.md)")


def selection_spec() -> Any:
    return scoring_case(f"one decode step's scoring ({SELECTION_RUN['context']:,}-token remote context, 1/4 of the "
                        "pages)", SELECTION_RUN["model"], SELECTION_RUN["context"], SELECTION_RUN["budget"], "eth-25g")


ROWS = (
    Row(Candidate("query-aware-selection",
                  "per decode step, page summaries scored in transit, the chosen pages fetched",
              "page scoring by MAC, mean key (flows/selection/model.py: scoring_declaration), host top-k",
              "attention-output error no worse than the equal-bytes quantiser's on the same real KV"),
        link="eth-25g", order=3, run=row_query_aware_selection,
        deck=DeckVerdict(PROMISING, "when KV is remote (scoring fits 3.96 op/B, not 0.40)"),
        regime=_selection_regime(), spec=selection_spec),
)
