"""Query-aware selection's row of the candidate table: `kvtransit select`, a pool, the module scoring the pages'
summaries in transit and decode over a shaped link, top-k and every token; the every-token fetch's measured share of
its step, the error of what arrived."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from kvtransit.harness.studies.candidates.rows import (
    SAMPLE_TEXT,
    Row,
    RowContext,
    RowRun,
    budget_flag,
    faithful_runs,
    links,
    load_real_kv,
    relative_l2,
)
from kvtransit.harness.studies.candidates.table import LINE_INPUT, Candidate, PrecisionFigure, RowMeasured
from kvtransit.model.catalog.links import link_by_name

# Query-aware selection as the offline row had it: a 32k-token remote context of llama3-8b, a quarter of the pages
# (Quest's usual budget; docs/results/selection.md's 1/4 row) with the sink page kept, mean keys scored in transit,
# beside the every-token baseline; 5 decode steps, the first a warm-up.
SELECTION_RUN: dict[str, Any] = dict(model="llama3-8b", context=32768, budget=0.25, sink_pages=1, steps=5)


def _selection(ctx: RowContext, budget: float | None) -> tuple[Any, dict[str, Any]]:
    from kvtransit.flows.selection.run import offline_selection, plan_selection, run_selection
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.module.budget import Module

    u = ctx.unknowns
    plan = plan_selection(model_by_name(SELECTION_RUN["model"]), device_by_name("h100"), link_by_name(ctx.link),
                          context=SELECTION_RUN["context"], sample=str(ctx.sample_path), text=SAMPLE_TEXT,
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
    return (f"kvtransit select --model {SELECTION_RUN['model']} --remote-context {SELECTION_RUN['context']} "
            f"--link {ctx.link} --select-budget {SELECTION_RUN['budget']:g} --sink-pages {SELECTION_RUN['sink_pages']} "
            f"--steps {SELECTION_RUN['steps']}{bits} {budget_flag(u.module_budget)} --json")


def row_query_aware_selection(ctx: RowContext) -> RowRun:
    from kvtransit.flows.selection.model import SelectionStep, scoring_declaration
    from kvtransit.kernels.ring_attention import full_attention, wire_codec
    from kvtransit.model.judge.five_tests import equal_bytes_baseline

    top_report, top = _selection(ctx, SELECTION_RUN["budget"])
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

    ratio = SelectionStep(model, context, SELECTION_RUN["budget"]).reduction
    baseline = equal_bytes_baseline(ratio)
    sample = load_real_kv(ctx)
    q, k, v, pos = sample.q, sample.k, sample.v, sample.q_positions
    codec = wire_codec(baseline)
    base_err = relative_l2(full_attention(q, pos, k, v), full_attention(q, pos, codec(k, 0), codec(v, 0)))
    acc = top.get("accuracy") or {}
    row = RowMeasured(
        ctx.name, scoring_declaration(model, "mean"), share,
        f"the every-token fetch's share of its decode step (fetch / step), {model.name} at {context:,} tokens",
        share_by_link={name: share_on(link) for name, link in links().items()}, link=ctx.link,
        link_bytes=float(SelectionStep(model, context).all_kv_bytes), share_whole="a decode step", line=LINE_INPUT,
        budget_ops_per_byte=ctx.unknowns.module_budget,
        precision=PrecisionFigure(acc.get("output_error") if top_report.ok else None, base_err,
                                  f"attention-output error of what arrived, budget {SELECTION_RUN['budget']:g} of the "
                                  f"pages (sink page kept) vs {baseline} at equal bytes (ratio {ratio:.2f})",
                                  at_bits=ctx.unknowns.precision_bits),
        streams=1.0 if top_report.ok else None, streams_as="streams scored (one context's summaries)",
        streams_counted=False)
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
                         "all_step_s": everything["measured_step_s"], "top_k_step_s": top["measured_step_s"]})


ROWS = (
    Row(Candidate("query-aware-selection",
                  "per decode step, page summaries scored in transit, the chosen pages fetched",
              "page scoring by MAC, mean key (flows/selection/model.py: scoring_declaration), host top-k",
              "attention-output error no worse than the equal-bytes quantiser's on the same real KV"),
        link="eth-25g", order=3, run=row_query_aware_selection),
)
