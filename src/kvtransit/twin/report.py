"""The twin's report: the live report's shape (report/build.py), every figure from the twin's run.

Same keys, so whatever reads a live report reads a twin's: the summaries and `per_request` come from the same
functions over the same `RequestRecord`s (model/judge/slo.py: `summarise`; report/build.py: `per_request_rows`). What
differs says so: `source` is "twin"; the link block is `measured_at: "twin"`; nothing was measured, so `faithful` is
false (it fails closed: a twin is not a faithful emulation, it is the model) and `fidelity` holds the one line that
says why; a flow's block is null, the flows' live blocks reading their processes' stats; `twin_run` holds the run's own
figures (events, the instances' steps, each role's step split into compute and a TP group's collectives as the
live `collectives` block reports it, the wall time the twin took).

A twin has no scale and no dilation: every byte is at full size, every time in model seconds (`config.scale` and
`config.dilation` still say what a live run of the scenario would use).
"""

from __future__ import annotations

import math
from typing import Any

from kvtransit.model.cost.energy import link_energy_j
from kvtransit.model.judge import fidelity
from kvtransit.model.judge.fidelity import prescribed_latency_s
from kvtransit.model.judge.slo import distribution, handoff_share, kv_wait_share, summarise
from kvtransit.model.serving.offered_load import offered_vs_capacity
from kvtransit.report.blocks import flow_reports
from kvtransit.report.build import exposed_s, per_request_rows
from kvtransit.report.finite import finite_json
from kvtransit.twin.serving import SOURCE, StepTotals, TwinRun
from kvtransit.workload.source import workload_description

TWIN_RUN = "a twin run, the model on a virtual clock (run it live to judge fidelity)"


def _hidden_s(run: TwinRun) -> dict[int, dict[str, float]]:
    """Each hand-off's hidden part, as decode measures it live (model/serving/layerwise.py: `HandoffSplit`): its first
    bytes at decode → min(first token, KV ready)."""
    out: dict[int, dict[str, float]] = {}
    latency_s = prescribed_latency_s(run.scenario)  # the link's, and the module's added latency in transit
    for r in run.records:
        stage = run.stages[r.request_id]
        first, ready = r.first_token_s, r.kv_ready_s
        if first is None or ready is None or stage.link_start_s is None:
            continue
        out[r.request_id] = {"hidden_s": max(0.0, min(first, ready) - (stage.link_start_s + latency_s))}
    return out


def _step_split(totals: StepTotals) -> dict[str, Any]:
    """A role's mean step and its collectives' part of it, model seconds (None without steps)."""
    n = totals.steps
    return {"steps": n, "step_s": totals.model_s / n if n else None,
            "collective_s": totals.collective_s / n if n else None,
            "collective_share": totals.collective_s / totals.model_s if totals.model_s > 0 else None}


def _prefix(run: TwinRun) -> dict[str, Any] | None:
    """The prefill caches' reuse over the run: cached prompt tokens / prompt tokens (the tier's hit rate)."""
    if run.cached_tokens is None:
        return None
    prompt = sum(r.prompt_tokens for r in run.records)
    cached = sum(run.cached_tokens.values())
    return {"prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": cached / prompt if prompt else None,
            "requests_with_hit": sum(1 for c in run.cached_tokens.values() if c > 0)}


def twin_report(run: TwinRun, *, wall_s: float | None) -> dict[str, Any]:
    """The report of a twin run; `wall_s`: how long the twin took, wall seconds, as its caller timed it (None: not
    timed; the twin keeps no clock but its own)."""
    scenario, records = run.scenario, run.records
    summary = summarise(records)
    hidden = _hidden_s(run)
    exposed = [e for r in records if (e := exposed_s(r)) is not None]
    hidden_total, exposed_total = math.fsum(h["hidden_s"] for h in hidden.values()), math.fsum(exposed)
    busy_s = run.link_busy_s
    flows = flow_reports()
    energy: dict[str, float | None] = {
        "link": link_energy_j(scenario.link_spec, run.wire_bytes),
        "module": run.module_energy_j,
        "gpu": run.gpu_energy_j,
        **{key: None for flow in flows for key in flow.ENERGY},
    }
    parts = [v for v in energy.values() if v is not None]
    tokens = run.tokens_delivered
    config = scenario.describe()
    config["module"]["transit_bound_frames"] = None
    report: dict[str, Any] = {
        "source": SOURCE,
        "config": config,
        "workload": {**workload_description(scenario),
                     "offered_vs_capacity": offered_vs_capacity(scenario, run.specs).as_dict()},
        **summary.as_dict(),
        "kv_wait_share": kv_wait_share(records),
        "handoff_share": handoff_share(records),
        "handoff_split": {
            "handoff": scenario.handoff, "prefill_chunk": scenario.prefill_chunk,
            "exposed_s": distribution(exposed), "handoffs": len(hidden),
            "exposed_s_total": exposed_total, "hidden_s_total": hidden_total,
            "exposed_share": exposed_total / (exposed_total + hidden_total) if exposed_total + hidden_total else None,
            "hidden_bytes_share": None,  # the twin books a hand-off's parts, not which bytes were where when
            "measured_at": SOURCE,
        },
        **{flow.KEY: None for flow in flows},
        "link": {
            "busy": busy_s / run.run_s if run.run_s > 0 else None,
            "configured_Bps": scenario.link_spec.bandwidth_Bps,
            "achieved_Bps": None,  # a rate is measured on a wire; the twin's is the configured one by construction
            "kv_bytes": run.kv_bytes, "wire_bytes": run.wire_bytes,
            "scaled_configured_Bps": None, "scaled_achieved_Bps": None,
            "measured_at": SOURCE,
        },
        "energy_j": energy,
        "j_per_token": math.fsum(parts) / tokens if parts and tokens else None,
        "accuracy": {"codec": scenario.codec, "sampled_requests": 0, "k_relative_error": None,
                     "v_relative_error": None},
        "faithful": False,
        "fidelity": {"twin": fidelity.not_measured(TWIN_RUN, 0.0).as_dict()},
        "errors": [],
        "verdict": None,
        "per_request": per_request_rows(records, hidden),
        "run": {"wall_s": None, "model_s": run.run_s, "tokens_delivered": tokens, "tokens_overtaking": 0,
                "agents": []},
        "twin_run": {
            "wall_s": wall_s, "events": run.events, "model_s": run.run_s,
            "prefill_steps": run.prefill_steps, "decode_steps": run.decode_steps,
            "step_split": {role: _step_split(totals) for role, totals in run.step_totals.items()},
            "prefix": _prefix(run),
            "stages": {rid: vars(stage) for rid, stage in run.stages.items()},
        },
    }
    return finite_json(report)
