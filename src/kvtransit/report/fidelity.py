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
  streamed run (`--handoff layerwise`, `--prefill-chunk`: issue 20) holds the exposed part of each such hand-off
  against the model's (`model.fidelity.prescribed_exposed_s`: max(0, transfer − prefill compute overlap)) by the
  same rule; decode judges it, where each chunk's release time and bytes are known (its /stats'
  `streamed_handoff_model`), the worst decode's figure counting;
- `collectives_<leader>` (`--prefill-tp` / `--decode-tp N`): each TP group's measured collective share of its step
  time against the model's (its leader's /stats' `tp_group`), within 3 points; a group that failed is not a pass.
- `pool_fetch` (`--kv-pool pool`, when a request looked up its prefix): the mean of every answered fetch's time, as
  the prefill measured it, against the mean of what the pool link's fetch lane prescribes for the same fetches in
  the order they were asked (a FIFO: model/judge/fidelity.py `prescribed_fetches_s`), within the live groups' band (5
  %);
- `ring_<prefill>` (`--ring-share`): the median over its ring requests of their attention round the ring as
  measured at rank 0 against the model's (flows/ring/ring_class.py), within the live groups' band (5 %); a ring that
  failed or ran no ring request is "not measured";
- `remote_kv_<decode>` (`--kv-placement remote`): the median over its steps whose remote legs had the link to
  themselves of measured / model at the bytes they moved (flows/selection/remote_class.py: legs_model_s), within the
  live groups' band (5 %); no such step is "not measured". A hand-off that met remote legs on the link is left out of
  `handoff_model` (it did not find the link idle).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from kvtransit.flows.ring.report import ring_ratio_median
from kvtransit.flows.selection.report import shared_handoffs
from kvtransit.model.judge import fidelity
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE
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


def _handoffs(scenario: Scenario, records: list[RequestRecord], decodes: list[dict]) -> tuple[fidelity.Gap, dict]:
    """The hand-off check and its distribution (model seconds, model bytes)."""
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
    shared = shared_handoffs(decodes)  # met remote KV's legs on the link (--kv-placement remote)
    idle = [r for r, free in zip(measured, fidelity.on_idle_link(intervals, scenario.channels), strict=True)
            if free and r.request_id not in shared]
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


def _collectives(role: str, leaders: list[dict], dilation: float) -> dict[str, fidelity.Gap]:
    groups = {s.get("name", role): s["tp_group"] for s in leaders if isinstance(s.get("tp_group"), dict)}
    if not groups:
        return {f"collectives_{role}": fidelity.not_measured(f"no {role} reported its TP group",
                                                             fidelity.COLLECTIVE_SHARE_TOLERANCE)}
    return {f"collectives_{name}": fidelity.collective_gap(g.get("measured_collective_share"),
                                                           g.get("model_collective_share"), dilation, g.get("failure"))
            for name, g in groups.items()}


def _pool_fetches(scenario: Scenario, prefills: list[dict]) -> fidelity.Gap:
    """Every answered pool fetch (all prefills', on the one fetch lane) against the lane's FIFO model: the mean
    measured over the mean prescribed, within the live groups' band."""
    fetches = [f for s in prefills for f in (s.get("prefix") or {}).get("fetches") or []]
    if not fetches:
        return fidelity.not_measured("no pool fetch was answered", fidelity.GROUP_TOLERANCE)
    want = fidelity.prescribed_fetches_s(scenario, [(f[0], f[1], f[2], f[4]) for f in fetches])
    return fidelity.model_gap(math.fsum(f[3] for f in fetches) / len(fetches), math.fsum(want) / len(want),
                              scenario.effective_dilation, "pool fetches")


def _asked_the_pool(prefills: list[dict]) -> bool:
    """Whether any request named blocks to look up in the pool (a run whose requests name none has no fetch)."""
    return any(sum(((s.get("prefix") or {}).get("lookups") or {}).values()) for s in prefills)


def _remote_kv(decodes: list[dict], scenario: Scenario) -> dict[str, fidelity.Gap]:
    what = "remote KV legs on an idle link"
    judged = {s.get("name", "decode"): s["remote_kv"] for s in decodes if isinstance(s.get("remote_kv"), dict)}
    if not judged:
        return {"remote_kv_decode": fidelity.not_measured("no decode reported its remote KV", fidelity.GROUP_TOLERANCE)}
    # Under --scale auto a higher dilation buys bigger payloads, not time: a step's legs are a few ms of link
    # whatever the dilation, and their host time (8 hops, the scoring, the ranking) grows with the bytes. A fixed
    # scale turns the dilation into headroom (measured on this 2-core box with a slow page gather: at 1/256 x1.22 at
    # dilation 1 and x1.005 at 2; under auto, dilation 2 made it 1/32 and still x1.2-1.4).
    fixed_scale = (str(Fraction(scenario.kv_layout.channels, scenario.model_spec.kv_dim))
                   if isinstance(scenario.scale, str) else None)
    return {f"remote_kv_{name}": (fidelity.model_gap(r["ratio_median"], 1.0, scenario.effective_dilation, what,
                                                     fixed_scale=fixed_scale)
                                  if r.get("idle_link_steps") else
                                  fidelity.not_measured(f"{name}: no step's remote legs had the link to themselves",
                                                        fidelity.GROUP_TOLERANCE))
            for name, r in judged.items()}


def _ring(prefills: list[dict], scenario: Scenario) -> dict[str, fidelity.Gap]:
    """Each prefill's ring: the median of its ring requests' measured / model attention, within the live groups'
    band; a ring that failed, or ran no ring request, is not a pass."""
    what = "ring attention"
    rings = {s.get("name", "prefill"): s["ring"] for s in prefills if isinstance(s.get("ring"), dict)}
    if not rings:
        return {"ring_prefill": fidelity.not_measured("no prefill reported its ring", fidelity.GROUP_TOLERANCE)}
    gaps = {}
    for name, ring in rings.items():
        ratio = ring_ratio_median(ring)
        if ring.get("failure"):
            gaps[f"ring_{name}"] = fidelity.not_measured(f"{name}'s ring failed: {ring['failure']}",
                                                         fidelity.GROUP_TOLERANCE)
        elif ratio is None:
            gaps[f"ring_{name}"] = fidelity.not_measured(f"{name} ran no ring request", fidelity.GROUP_TOLERANCE)
        else:
            gaps[f"ring_{name}"] = fidelity.model_gap(ratio, 1.0, scenario.effective_dilation, what)
    return gaps


def fidelity_block(scenario: Scenario, records: list[RequestRecord], *, prefills: list[dict], decodes: list[dict],
                   middleboxes: list[dict], scaled_achieved_Bps: float | None,
                   missing_stats: Sequence[str] = ()) -> tuple[bool, dict[str, dict[str, Any]]]:
    """(`faithful`, `fidelity`): faithful only when every check ran and passed."""
    scale, dilation = scenario.effective_scale, scenario.effective_dilation
    gaps: dict[str, fidelity.Gap] = {}
    if missing_stats:
        gaps["stats"] = fidelity.not_measured("; ".join(missing_stats), 0.0)
    gaps.update(_timer_gaps(records, prefills, decodes, dilation))
    if decodes:
        # A transit-bound module (its compute outlasts the wire, REFERENCE §5) paces the link below its rate:
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
        gaps["handoff_model"], distribution = _handoffs(scenario, records, decodes)
    if scenario.prefill_tp > 1:
        gaps.update(_collectives("prefill", prefills, dilation))
    if scenario.decode_tp > 1:
        gaps.update(_collectives("decode", decodes, dilation))
    if scenario.remote_kv:
        gaps.update(_remote_kv(decodes, scenario))
    if scenario.ring:
        gaps.update(_ring(prefills, scenario))
    if scenario.kv_pool == "pool" and (_asked_the_pool(prefills) or not prefills):
        gaps["pool_fetch"] = _pool_fetches(scenario, prefills)
    faithful, block = fidelity.assess(gaps)
    block["handoff_model"]["distribution"] = distribution
    return faithful, block
