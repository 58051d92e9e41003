"""The run report's `faithful` verdict and `fidelity` block: each check of `model/judge/fidelity.py`, fed from what the
client measured and what each peer's /stats says.

Fail closed: a check that could not run is in the block as "not measured: …" and makes the run unfaithful.
The checks, by name in the block:
- `stats`: every peer the load generator was told to ask answered (else: which did not);
- `timer_<agent>`: each prefill's and decode's mean wake-up lateness against its shortest step; a role whose
  figures are in the report (TTFT: prefill; TPOT: decode) but whose timers saw no wake-up is `timer_<role>`;
- `link_rate`: the link's achieved rate while busy against the configured (scaled) rate;
- `kernel_time`: the codec's real compute time against the modelled time of the same bytes;
- `handoff_model`: each hand-off that found a lane of the link free, measured at the client, against the
  model's latency + bytes / bw (+ module terms); its `distribution` of measured / prescribed is beside it. A
  streamed run (`--handoff layerwise`, `--prefill-chunk`) holds the exposed part of each such hand-off
  against the model's (`model.fidelity.prescribed_exposed_s`: max(0, transfer − prefill compute overlap)) by the
  same rule; decode judges it, where each chunk's release time and bytes are known (its /stats'
  `streamed_handoff_model`), the worst decode's figure counting;
- each flow's own checks, from its REPORT (report/blocks.py): a TP group's collective share (`collectives_<leader>`,
  flows/tp/report.py), the pool's fetches (`pool_fetch`, flows/tier/report.py), a ring's attention
  (`ring_<prefill>`, flows/ring/report.py), remote KV's legs (`remote_kv_<decode>`, flows/selection/report.py);
  a hand-off that met a flow's traffic on the link (remote KV's legs) is left out of `handoff_model` (it did not
  find the link idle).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from kvtransit.model.judge import fidelity
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE
from kvtransit.report.blocks import FlowReport, RunData
from kvtransit.report.peer_stats import stat_sum


def _timer_gaps(records: list[RequestRecord], prefills: list[dict], decodes: list[dict],
                dilation: float) -> dict[str, fidelity.Gap]:
    gaps: dict[str, fidelity.Gap] = {}
    # A role's timers must have run if the figures they drive are in the report.
    drives = {"prefill": any(r.first_token_s is not None for r in records),
              "decode": any(r.tpot_s is not None for r in records)}
    for role, agents in (("prefill", prefills), ("decode", decodes)):
        timed = [s for s in agents if s.get("shortest_step_wall_s")]
        for s in timed:
            gap = fidelity.timer_gap(s.get("timer_lateness_mean_s"), s["shortest_step_wall_s"], dilation)
            priority = s.get("timer_priority", "")
            if not gap.ok and priority.startswith("normal"):  # what would have helped (runtime/wakeup_priority.py)
                gap = dataclasses.replace(gap, hint=f"{gap.hint} (its timers ran at {priority})")
            gaps[f"timer_{s['name']}"] = gap
        if not timed and drives[role]:
            what = f"no {role} stats" if not agents else f"no {role} step was timed"
            gaps[f"timer_{role}"] = fidelity.not_measured(what, fidelity.TIMER_TOLERANCE)
    return gaps


def _wire_per_kv_byte(decodes: list[dict]) -> float | None:
    """The codec's real ratio in this run, wire bytes over KV bytes as decode's link meter received them (None
    when the meter saw no bytes)."""
    raw = stat_sum(decodes, "link", "raw_bytes")
    return stat_sum(decodes, "link", "wire_bytes") / raw if raw > 0 else None


def _handoffs(scenario: Scenario, records: list[RequestRecord], decodes: list[dict],
              not_idle: set[int]) -> tuple[fidelity.Gap, dict]:
    """The hand-off check and its distribution (model seconds, model bytes); `not_idle`: hand-offs that met a
    flow's traffic on the link (remote KV's legs), left out."""
    measured = [r for r in records if r.handoff_s is not None and r.kv_ready_s is not None]
    wire_per_kv_byte = _wire_per_kv_byte(decodes)
    if wire_per_kv_byte is None:
        gap = fidelity.not_measured("decode's link meter has no bytes", fidelity.HANDOFF_REL_TOLERANCE)
        return gap, fidelity.handoff_distribution([], [], len(measured))
    intervals = []
    for r in measured:
        start = r.first_token_stamp_s if r.first_token_stamp_s is not None else r.first_token_s
        assert start is not None and r.kv_ready_s is not None  # handoff_s is not None
        intervals.append((start, r.kv_ready_s))
    idle = [r for r, free in zip(measured, fidelity.on_idle_link(intervals, scenario.channels), strict=True)
            if free and r.request_id not in not_idle]
    model = scenario.model_spec
    got = [r.handoff_s for r in idle if r.handoff_s is not None]
    want = [fidelity.prescribed_handoff_s(scenario, kv, kv * wire_per_kv_byte)
            for kv in (float(model.kv_bytes(r.prompt_tokens)) for r in idle)]
    return (fidelity.handoff_gap(got, want, scenario.effective_dilation),
            fidelity.handoff_distribution(got, want, len(measured)))


def _streamed_handoffs(decodes: list[dict]) -> tuple[fidelity.Gap, dict]:
    """The streamed hand-off check, as decode judged it (the worst decode's when there are several)."""
    judged = [d["streamed_handoff_model"] for d in decodes if isinstance(d.get("streamed_handoff_model"), dict)]
    if not judged:
        gap = fidelity.not_measured("no decode held a streamed hand-off against the model",
                                    fidelity.HANDOFF_REL_TOLERANCE)
        return gap, fidelity.handoff_distribution([], [], 0)
    worst = max(judged, key=lambda j: (not j["check"]["ok"], abs(j["check"]["measured"])
                                       if j["check"]["measured"] is not None else math.inf))
    check = worst["check"]
    measured = math.nan if check["measured"] is None else check["measured"]
    gap = fidelity.Gap(measured, check["target"], all(j["check"]["ok"] for j in judged), check["hint"])
    return gap, {**worst["distribution"], "measured_at": "decode"}


def fidelity_block(run: RunData, flows: Sequence[FlowReport], *, scaled_achieved_Bps: float | None,
                   missing_stats: Sequence[str] = ()) -> tuple[bool, dict[str, dict[str, Any]]]:
    """(`faithful`, `fidelity`): faithful only when every check ran and passed, the core's and each flow's."""
    scenario, records = run.scenario, list(run.records)
    prefills, decodes, middleboxes = list(run.prefills), list(run.decodes), list(run.middleboxes)
    scale, dilation = scenario.effective_scale, scenario.effective_dilation
    gaps: dict[str, fidelity.Gap] = {}
    if missing_stats:
        gaps["stats"] = fidelity.not_measured("; ".join(missing_stats), 0.0)
    gaps.update(_timer_gaps(records, prefills, decodes, dilation))
    if decodes:
        # A transit-bound module (its compute outlasts the wire, docs/reference.md §5) paces the link below its rate:
        # the link is held against the rate the module lets it reach.
        wire_per_kv = _wire_per_kv_byte(decodes)
        target_Bps = fidelity.link_rate_target_Bps(scenario, scenario.scaled_link.bandwidth_Bps,
                                                   1.0 if wire_per_kv is None else wire_per_kv)
        gaps["link_rate"] = fidelity.link_gap(scaled_achieved_Bps or 0.0, target_Bps, scale, dilation)
    else:
        gaps["link_rate"] = fidelity.not_measured("no decode stats", fidelity.LINK_RATE_TOLERANCE)
    if middleboxes:
        kernel_s = stat_sum(middleboxes, "kernel_compute_s")  # the middlebox's /stats: real and modelled kernel time
        modelled_s = stat_sum(middleboxes, "modelled_compute_s")
        if modelled_s <= 0:
            # A free transform (passive optics) models no compute time; the host kernel must still keep up
            # with the link, so it is held against the link time of the bytes it produced.
            modelled_s = stat_sum(middleboxes, "wire_bytes") / scenario.scaled_link.bandwidth_Bps
        gaps["kernel_time"] = fidelity.kernel_gap(kernel_s, modelled_s, scale, dilation)
    else:
        gaps["kernel_time"] = fidelity.not_measured("no middlebox stats", fidelity.KERNEL_TOLERANCE)
    if scenario.handoff == HANDOFF_LAYERWISE or scenario.prefill_chunk > 0:
        gaps["handoff_model"], distribution = _streamed_handoffs(decodes)
    else:
        not_idle = {rid for flow in flows for rid in flow.not_idle(run)}
        gaps["handoff_model"], distribution = _handoffs(scenario, records, decodes, not_idle)
    for flow in flows:  # each flow's own checks (report/blocks.py)
        gaps.update(flow.fidelity(run))
    faithful, block = fidelity.assess(gaps)
    block["handoff_model"]["distribution"] = distribution
    return faithful, block
