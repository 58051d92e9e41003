"""The run report: what the client measured, joined with what each agent measured (`/stats`).

Keys (binding: studies, dashboards and tests read them): `config`; `ttft_s`, `tpot_s`, `itl_s`, `e2e_s`, `handoff_s`
each `{mean, p50, p90, p99, max}`; `slo_attainment`; `goodput_rps`; `requests` `{total, ok, slo_miss, failed,
failed_reasons}`; `link` `{busy, configured_Bps, achieved_Bps, kv_bytes, wire_bytes}`; `energy_j` `{link, module, gpu}`
and `j_per_token`; `accuracy`; `faithful` and `fidelity`.

`config.module` is the module's terms (docs/reference.md §5): its budget, the ops per byte the codec is charged, pJ per
input bit, added latency, and whether the run is transit-bound (the module's compute, not the wire, sets each
hand-off), beside `transit_bound_frames`, the frames the middlebox found so.

`accuracy` also holds the equal-bytes baseline decode measured on the same sampled tensors (`baseline_codec`,
`baseline_k_relative_error`, `baseline_v_relative_error`, `baseline_ratio`), and `verdict` is the KV hand-off's
five tests (docs/reference.md §8, `model/judge/five_tests.py`), computed from the report's own fields
(`handoff_verdict`), so `kvtransit verdict` gives the same answer for a report written before the block existed.

`handoff_split` (model/serving/layerwise.py) splits the hand-off at the first token: **exposed** (KV ready −
first token, ≥ 0: what a user waits for; its distribution as the client measured it) and **hidden** (in flight before
the first token: its time and its bytes, as decode measured them), with the exposed share of the two. In whole mode
(docs/reference.md §4) nothing hides; with `--handoff layerwise` or `--prefill-chunk` most of a hand-off may. Each
request's split is in `per_request` (`handoff_exposed_s`, and `handoff_hidden_s` when the caller passes decode's
figures). A streamed run's link figures are decode's (its busy time leaves out the gaps a stream waits for compute in;
the middlebox's shaper counts a transfer's whole span).

`figures` (set when the report is written: `write_report`) lists the PNGs drawn beside it in
`REPORT.figures/` (`name`, `file` relative to the report's folder, `title`, `caption`): CDFs of TTFT, TPOT and the
hand-off, the link's busy fraction and queue depth, a per-request timeline (`report_figures.py` computes them,
`report_plots.py` draws them, with the `plots` extra); an empty list without it.

All timings and rates are in model terms: seconds ÷ dilation, bytes ÷ the payload scale (what the modelled,
full-size system would have moved). A figure nobody could measure is null, never invented.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvtransit.model.cost.energy import link_energy_j
from kvtransit.model.judge.five_tests import HandoffMeasured, PrecisionMeasured, judge_handoff
from kvtransit.model.judge.slo import RequestRecord, distribution, handoff_share, kv_wait_share, summarise
from kvtransit.model.judge.task_accuracy import MeasuredTaskLoss
from kvtransit.model.scenario import REAL_MODEL_KV, Scenario, field_names
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE
from kvtransit.model.serving.offered_load import offered_vs_capacity
from kvtransit.model.serving.workload import RequestSpec
from kvtransit.report.blocks import RunData, flow_reports
from kvtransit.report.fidelity import fidelity_block
from kvtransit.report.finite import finite_json
from kvtransit.report.model_accuracy import model_accuracy_block, model_accuracy_errors
from kvtransit.report.peer_stats import stat_sum
from kvtransit.report.text import to_markdown
from kvtransit.workload.source import requests_for, workload_description

REPORT_KEYS = ("config", "ttft_s", "tpot_s", "itl_s", "e2e_s", "handoff_s", "slo_attainment", "goodput_rps",
               "requests", "link", "energy_j", "j_per_token", "accuracy", "faithful", "fidelity")


def streamed(scenario: Scenario) -> bool:
    """The KV is released as it is computed (layer-wise, or chunked prefill), not whole at the first token."""
    return scenario.handoff == HANDOFF_LAYERWISE or scenario.prefill_chunk > 0


def exposed_s(record: RequestRecord) -> float | None:
    """The exposed hand-off: KV ready − first token, ≥ 0 (docs/reference.md §4's hand-off;
    model/serving/layerwise.py)."""
    handoff = record.handoff_s
    return None if handoff is None else max(0.0, handoff)


def per_request_rows(records: Sequence[RequestRecord],
                     handoff_splits: Mapping[int, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
    """The report's `per_request` rows: each request's figures as its client saw them (model seconds), its hidden
    hand-off as decode measured it (`handoff_splits`; None without). A live run's and its twin's (twin/report.py)
    are the same rows, so twin/diff.py sets them side by side."""
    return [
        {"id": r.request_id, "arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
         "output_tokens": r.output_tokens, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s, "e2e_s": r.e2e_s,
         "handoff_s": r.handoff_s, "decode_wait_s": r.decode_wait_s, "outcome": r.outcome.value,
         "failure": r.failure, "handoff_exposed_s": exposed_s(r),
         "handoff_hidden_s": (handoff_splits or {}).get(r.request_id, {}).get("hidden_s")}
        for r in records]


def handoff_split(scenario: Scenario, records: Sequence[RequestRecord], decodes: list[dict]) -> dict[str, Any]:
    """The report's `handoff_split` block (module docstring): the exposed distribution at the client, and decode's
    sums of both parts (model seconds) and of the bytes that crossed before the first token."""
    counted = [d for d in decodes if isinstance(d.get("handoff_split"), dict)]
    exposed_total = stat_sum(counted, "handoff_split", "exposed_s")
    hidden_total = stat_sum(counted, "handoff_split", "hidden_s")
    moved = stat_sum(counted, "handoff_split", "bytes")
    split_handoffs = int(stat_sum(counted, "handoff_split", "handoffs"))
    both = exposed_total + hidden_total
    return {
        "handoff": scenario.handoff,
        "prefill_chunk": scenario.prefill_chunk,
        "exposed_s": distribution(e for r in records if (e := exposed_s(r)) is not None),
        "handoffs": split_handoffs if counted else None,
        "exposed_s_total": exposed_total if counted else None,
        "hidden_s_total": hidden_total if counted else None,
        # Of the hand-off's time (first KV bytes at decode, or the first token, → KV ready), the part a user waits.
        "exposed_share": exposed_total / both if counted and both > 0 else None,
        "hidden_bytes_share": stat_sum(counted, "handoff_split", "hidden_bytes") / moved if moved > 0 else None,
        "measured_at": "client (exposed_s), decode (totals, shares)",
    }


def build_report(scenario: Scenario, records: list[RequestRecord], peer_stats: list[dict], *, run_wall_s: float,
                 tokens_delivered: int, middlebox_stats: list[dict] | None = None,
                 missing_stats: Sequence[str] = (), workload: Sequence[RequestSpec] | None = None,
                 handoff_splits: Mapping[int, Mapping[str, float]] | None = None, tokens_overtaking: int = 0) -> dict:
    """`missing_stats`: one line per peer whose /stats could not be read; they are the report's `errors` and
    make the run unfaithful (fidelity `stats`). `workload`: the requests the run sent (the load generator
    passes what it holds; without it they are drawn, or the trace read, again from the scenario).
    `handoff_splits`: each request's hand-off split as decode measured it (request id → `hidden_s`, ...: decode's
    `handoff_split` beside its queue waits), for `per_request`; without it each request's hidden part is null.
    `tokens_overtaking`: tokens that arrived before an earlier token of their request (held, then delivered in
    order: agents/loadgen/agent.py `_token`)."""
    summary = summarise(records)
    scale, dilation = scenario.effective_scale, scenario.effective_dilation
    decodes = [s for s in peer_stats if s.get("role") == "decode"]
    prefills = [s for s in peer_stats if s.get("role") == "prefill"]
    middleboxes = (middlebox_stats if middlebox_stats is not None
                   else [s for s in peer_stats if s.get("role") == "middlebox"])
    link_spec = scenario.link_spec

    # The link as the decode end received it, scaled back to the modelled system.
    wire_bytes_scaled = stat_sum(decodes, "link", "wire_bytes")
    raw_bytes_scaled = stat_sum(decodes, "link", "raw_bytes")
    busy_wall_s = stat_sum(decodes, "link", "busy_s")
    has_link = bool(decodes)
    wire_bytes = wire_bytes_scaled / scale if has_link else None
    kv_bytes = raw_bytes_scaled / scale if has_link else None
    achieved_model_Bps = (wire_bytes / (busy_wall_s / dilation)) if wire_bytes is not None and busy_wall_s > 0 else None
    link: dict[str, Any] = {  # the report's JSON block
        "busy": (busy_wall_s / run_wall_s) if has_link and run_wall_s > 0 else None,
        "configured_Bps": link_spec.bandwidth_Bps,
        "achieved_Bps": achieved_model_Bps,
        "kv_bytes": kv_bytes,
        "wire_bytes": wire_bytes,
        "scaled_configured_Bps": scenario.scaled_link.bandwidth_Bps,
        "scaled_achieved_Bps": (wire_bytes_scaled / busy_wall_s) if has_link and busy_wall_s > 0 else None,
        "measured_at": "decode",
    }
    # The link's sender knows its serialising time exactly (the receiver's view also holds the kernel's and
    # the sender's delays): when a middlebox reports its shaper, its rate and busy figures are the link's.
    shapers = [m["link"] for m in middleboxes
               if isinstance(m.get("link"), dict) and m["link"].get("shaped_achieved_Bps") and not streamed(scenario)]
    if shapers:
        link.update(achieved_Bps=sum(x["achieved_Bps"] for x in shapers) / len(shapers),
                    scaled_achieved_Bps=sum(x["shaped_achieved_Bps"] for x in shapers) / len(shapers),
                    busy=max(x["busy"] for x in shapers), measured_at="middlebox")

    flows = flow_reports()
    run = RunData(scenario, records, peer_stats, prefills, decodes, middleboxes, run_wall_s / dilation,
                  summary.as_dict())
    energy: dict[str, float | None] = {
        "link": link_energy_j(link_spec, wire_bytes) if wire_bytes is not None else None,
        # The middlebox's own counter (the optics' energy for the chunks its kernel ran on in the module; none
        # when the kernel ran on the host or the codec on the GPU), not a figure re-derived here.
        "module": stat_sum(middleboxes, "module_energy_j") if middleboxes else None,
        "gpu": (stat_sum(prefills, "gpu_energy_j") + stat_sum(decodes, "gpu_energy_j")
                if (prefills or decodes) else None),
    }
    for flow in flows:  # what each flow's traffic spent (the tier's pool link, remote KV's legs)
        energy.update(flow.energy(run))
    parts = [v for v in energy.values() if v is not None]
    j_per_token = (math.fsum(parts) / tokens_delivered) if parts and tokens_delivered else None

    sampled = int(stat_sum(decodes, "accuracy", "sampled_requests"))
    accuracy = {"codec": scenario.codec, "sampled_requests": sampled,
                "k_relative_error": None, "v_relative_error": None}
    if sampled:  # one decode's figures, or the worst over several (an error must never be averaged away)
        for part in ("k", "v"):
            values = [s["accuracy"][f"{part}_relative_error"] for s in decodes
                      if s["accuracy"]["sampled_requests"] and s["accuracy"][f"{part}_relative_error"] is not None]
            accuracy[f"{part}_relative_error"] = max(values) if values else None
    accuracy.update(_baseline_accuracy(decodes))
    model_errors: list[str] = []
    if scenario.kv_sample == REAL_MODEL_KV:  # the real model read the real-KV hand-offs (report/model_accuracy.py)
        model_block = model_accuracy_block(scenario, prefills, decodes)
        accuracy["model"] = model_block
        model_errors = model_accuracy_errors(model_block)

    faithful, fidelity_dict = fidelity_block(run, flows, scaled_achieved_Bps=link["scaled_achieved_Bps"],
                                             missing_stats=missing_stats)

    config = scenario.describe()
    # The module's terms as the model judges them (config.module: budget, charged ops/B, transit-bound), beside
    # what the middlebox measured: the frames its module stage found slower than the wire.
    config["module"]["transit_bound_frames"] = (int(stat_sum(middleboxes, "transit_bound_frames"))
                                                if middleboxes else None)
    report = {
        "config": config,
        # For a trace: sampling, time scale, context cap applied; for any workload: its offered load against
        # the modelled capacity (model/serving/offered_load.py), the figure `kvtransit up` warned with before the run.
        "workload": {**workload_description(scenario),
                     "offered_vs_capacity": offered_vs_capacity(
                         scenario, workload if workload is not None else requests_for(scenario)).as_dict()},
        **summary.as_dict(),
        # Mean over requests of (hand-off + decode queue wait) / E2E (model/judge/slo.py: kv_wait_share); the hand-off
        # there is KV ready − first token, the exposed part (handoff_split).
        "kv_wait_share": kv_wait_share(records),
        # The deck's definition of it (slide 03): Σ hand-off / Σ E2E, no decode queue wait (model/judge/slo.py).
        "handoff_share": handoff_share(records),
        "handoff_split": handoff_split(scenario, records, decodes),
        # Each flow's block under its key (report/blocks.py), None when the scenario turns the flow off.
        **{flow.KEY: flow.block(run) for flow in flows},
        "link": link,
        "energy_j": energy,
        "j_per_token": j_per_token,
        "accuracy": accuracy,
        "faithful": faithful,
        "fidelity": fidelity_dict,
        "errors": [*missing_stats, *model_errors],
        "verdict": None,  # filled in below, from the fields above
        "per_request": per_request_rows(records, handoff_splits),
        "run": {"wall_s": run_wall_s, "model_s": run_wall_s / dilation, "tokens_delivered": tokens_delivered,
                "tokens_overtaking": tokens_overtaking, "agents": peer_stats},
    }
    report = finite_json(report)
    report["verdict"] = handoff_verdict(report, scenario, middleboxes=middleboxes)
    return report


def _baseline_accuracy(decodes: list[dict]) -> dict[str, Any]:
    """The equal-bytes baseline decode measured beside the codec (the worst error over several decodes, as the
    codec's own); nulls when no decode measured one (codec none, or a decode that predates it)."""
    measured = [s["accuracy"] for s in decodes if isinstance(s.get("accuracy"), dict)
                and s["accuracy"].get("sampled_requests") and s["accuracy"].get("baseline_codec")
                and s["accuracy"].get("baseline_k_relative_error") is not None]
    block: dict[str, Any] = {"baseline_codec": measured[0]["baseline_codec"] if measured else None}
    for part in ("k", "v"):
        values = [a[f"baseline_{part}_relative_error"] for a in measured
                  if a.get(f"baseline_{part}_relative_error") is not None]
        block[f"baseline_{part}_relative_error"] = max(values) if values else None
    ratios = [a["baseline_ratio"] for a in measured if a.get("baseline_ratio")]
    block["baseline_ratio"] = sum(ratios) / len(ratios) if ratios else None
    return block


class MissingReportField(ValueError):
    """A report lacks a field the verdict needs (an old or foreign JSON file): the message names the field."""


# The config fields the KV hand-off's declaration and module are built from (model/scenario.py).
VERDICT_CONFIG_FIELDS = ("codec", "keep", "block", "compress_at", "transform_charged", "precision_bits", "placement",
                         "module_budget")


def _field(report: dict, *path: str) -> Any:
    value: Any = report
    for i, key in enumerate(path):
        if not isinstance(value, dict) or key not in value:
            raise MissingReportField(f"no {'.'.join(path[:i + 1])!r} in the report")
        value = value[key]
    return value


def scenario_from_config(config: dict) -> Scenario:
    """The run's scenario again, from a report's `config` block (its fields; the derived figures are ignored)."""
    for name in VERDICT_CONFIG_FIELDS:
        if name not in config:
            raise MissingReportField(f"no 'config.{name}' in the report")
    return Scenario.build(**{name: config[name] for name in field_names() if name in config})


def handoff_verdict(report: dict, scenario: Scenario | None = None, *,
                    middleboxes: list[dict] | None = None) -> dict[str, Any]:
    """The report's `verdict` block: the KV hand-off's five tests (model/judge/five_tests.py) from the report's own
    fields: `kv_wait_share`, `link.busy`, `accuracy` (the codec's and the baseline's error) and the middlebox's
    frame counters (its /stats, under `run.agents` unless given), judged against the declaration the run's
    module was charged for. `scenario`: the run's (default: rebuilt from `config`)."""
    if scenario is None:
        scenario = scenario_from_config(_field(report, "config"))
    if middleboxes is None:
        middleboxes = [a for a in _field(report, "run", "agents")
                       if isinstance(a, dict) and a.get("role") == "middlebox"]
    accuracy = _field(report, "accuracy")
    precision = PrecisionMeasured(
        sampled_requests=int(_field(report, "accuracy", "sampled_requests") or 0),
        k_relative_error=_field(report, "accuracy", "k_relative_error"),
        v_relative_error=_field(report, "accuracy", "v_relative_error"),
        baseline_codec=accuracy.get("baseline_codec"),
        baseline_k_relative_error=accuracy.get("baseline_k_relative_error"),
        baseline_v_relative_error=accuracy.get("baseline_v_relative_error"),
        baseline_ratio=accuracy.get("baseline_ratio"))

    def counted(key: str) -> int | None:
        return int(stat_sum(middleboxes, key)) if middleboxes else None

    measured = HandoffMeasured(
        kv_wait_share=_field(report, "kv_wait_share"), link_busy=_field(report, "link", "busy"),
        transit_bound_frames=counted("transit_bound_frames"), frames_in=counted("frames_in"),
        frames_out=counted("frames_out"), precision=precision)
    if scenario.codec == "none":
        decl, why = None, "no kernel on this link (codec none)"
    elif scenario.compress_at != "transit":
        decl, why = None, f"no kernel on this link (codec {scenario.codec} runs at the {scenario.compress_at})"
    else:
        decl, why = scenario.codec_declaration, ""
    tests = judge_handoff(decl, scenario.module_budget_ops_per_byte, measured, no_kernel_reason=why or "-",
                          task=live_task_loss(scenario, accuracy.get("model")))
    return finite_json({**tests.as_dict(), "measured_at": {"scale": scenario.effective_scale,
                                                           "dilation": scenario.effective_dilation}})


def live_task_loss(scenario: Scenario, block: Any) -> MeasuredTaskLoss | None:
    """The real model's reading of this run's KV (`accuracy.model`, `--accuracy model`) as the precision test's
    task-level loss: every real-KV request read and scored, perplexity pooled over them; else None (the test then
    judges by tensor error, or by a results file given to `kvtransit verdict`)."""
    if (not isinstance(block, dict) or not block.get("scored_tokens") or block.get("pending")
            or block.get("failed") or block.get("ppl_increase") is None):
        return None
    return MeasuredTaskLoss(
        key=f"{scenario.codec} (live)", ppl_exact=block["ppl_sent"], ppl=block["ppl"],
        ppl_increase=block["ppl_increase"], kl=block["kl"], top1=block["top1"], tokens=block["scored_tokens"],
        source=(f"{block['model']} reading the KV that crossed this run's link ({block['measured']} requests, "
                f"{block['scored_tokens']} tokens scored, against the KV the prefill sent)"))


def annotate_report(report: dict, *, links: dict | None = None, prometheus_url: str | None = None) -> dict:
    """What only the launcher knows, joined in after the load generator wrote the report: how the links were
    built (`config.links`) and which back-end shaped each link property (`link.backends`, e.g. rate "tc tbf",
    delay "userspace"), and the run's Prometheus (`prometheus.url`)."""
    if links is not None:
        report["config"]["links"] = links
        report["link"]["backends"] = dict(links["backends"])
    if prometheus_url is not None:
        report["prometheus"] = {"url": prometheus_url}
    return report


def write_report(report: dict, path: Path, *, figures: bool = True) -> tuple[Path, Path]:
    """`path` (JSON) and the same name with .md; with `figures` (and the plots extra) the PNGs in
    `REPORT.figures/` first, listed in the report's `figures` key (set on `report` too) and shown in the .md."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    note = None
    if figures:
        from kvtransit.report.plots import draw_report_figures  # matplotlib, if at all, only now

        try:
            report["figures"], note = draw_report_figures(report, path)
        except Exception as exc:
            # The figures are extras: a drawing failure must not cost a finished run its report. Said in the .md.
            report["figures"], note = [], f"Figures: not drawn ({type(exc).__name__}: {exc})."
    path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    markdown = path.with_suffix(".md")
    markdown.write_text(to_markdown(report, figures_note=note))
    return path, markdown
