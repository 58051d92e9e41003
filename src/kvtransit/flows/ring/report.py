"""The report's `ring` block (`--ring-share`): the ring class's prefill as its rings ran it, beside the model, and
what it cost the class's TTFT; None without a ring class.

Joined from each prefill's /stats (`ring`, agents/prefill/agent.py: each ring request's attention, measured and
modelled, and rank 0's side of the ring: hops, bytes); the class's TTFT is the client's own, split by the pure
class rule (flows/ring/ring_class.py: in_ring_class). Seconds are model seconds, bytes model bytes (× 1/ring_scale: a
block's channels are the run's, fewer when the ring's ranks would overrun the host, Scenario.ring_layout). The
attention is judged per prefill, the median of measured / model over its ring requests (fidelity_report.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from kvtransit.flows.ring.section import RingSection
from kvtransit.model.judge import fidelity
from kvtransit.model.judge.slo import Outcome, RequestRecord, distribution
from kvtransit.model.scenario import Scenario
from kvtransit.report.blocks import FlowReport, RunData, ms


def _ttft_ms(records: list[RequestRecord]) -> dict[str, float] | None:
    values = [r.ttft_s * 1e3 for r in records if r.ttft_s is not None]
    return distribution(values) if values else None


def ring_ratio_median(stats: dict) -> float | None:
    """One prefill's median of measured / model attention over its ring requests (None: none ran); every ring
    request's model attention is the same (`model_s`)."""
    measured = stats.get("measured_s") or []
    return statistics.median(measured) / stats["model_s"] if measured else None


def ring_summary(scenario: Scenario, records: list[RequestRecord], prefills: list[dict]) -> dict[str, Any] | None:
    ring_section = RingSection.of(scenario)
    if not ring_section.on:
        return None
    stats = [p["ring"] for p in prefills if isinstance(p.get("ring"), dict)]
    model = ring_section.model(scenario)
    measured = [m for s in stats for m in s["measured_s"]]
    ring = [r for r in records if ring_section.is_ring_request(scenario, r.request_id)]
    other = [r for r in records if not ring_section.is_ring_request(scenario, r.request_id)]
    prompts = sum(len(s["measured_s"]) for s in stats)
    hops = sum(s["hops"] for s in stats)
    ratios = [x for x in (ring_ratio_median(s) for s in stats) if x is not None]
    return {
        "ranks": ring_section.ring_ranks, "link": ring_section.ring_link, "prompt_tokens": ring_section.ring_prompt,
        "block_tokens": model.block_tokens, "share": ring_section.ring_share,
        "requests": {"ring": len(ring), "other": len(other),
                     "ring_finished": sum(1 for r in ring if r.finished),
                     "ring_failed": sum(1 for r in ring if r.outcome is Outcome.FAILED)},
        "ttft_ms": {"ring": _ttft_ms(ring), "other": _ttft_ms(other)},
        "model": {"hop_link_s": model.hop.link_s, "hop_compute_s": model.hop.compute_s,
                  "link_bound": model.hop.link_bound, "attention_s": model.attention_s, "rest_s": model.rest_s,
                  "prefill_s": model.total_s},
        "attention_s": {"measured": statistics.fmean(measured) if measured else None,
                        "measured_p99": distribution(measured)["p99"] if measured else None,
                        "model": model.attention_s},
        # The worst prefill's median of measured / model over its ring requests.
        "ratio_median": max(ratios, key=lambda r: abs(r - 1)) if ratios else None,
        # Rank 0's hops a layer: n − 1 when every prompt ran whole.
        "hops_per_layer": hops / (prompts * model.layers) if prompts else None,
        "hop_bytes": sum(s["raw_bytes"] for s in stats) / ring_section.scale(scenario),
        "scale": ring_section.scale(scenario),
        "late_s": sum(s["late_s"] for s in stats),
        "failed_prompts": sum(s["failed"] for s in stats),
        "failures": sorted({s["failure"] for s in stats if s.get("failure")}),
    }


def ring_line(block: dict | None) -> list[str]:
    if not block:
        return []

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.4g} ms"

    ttft = block["ttft_ms"]
    ring_p50, other_p50 = (f"{t['p50']:.4g} ms" if t else "-" for t in (ttft["ring"], ttft["other"]))
    ratio = block["ratio_median"]
    bound = "link-bound" if block["model"]["link_bound"] else "compute-bound"
    hops = block["hops_per_layer"]
    requests = block["requests"]
    line = (f"ring attention ({block['ranks']} GPUs over {block['link']}, {block['prompt_tokens']}-token prompts in "
            f"blocks of {block['block_tokens']}; {requests['ring']} ring requests, {requests['ring_failed']} "
            f"failed): attention {ms(block['attention_s']['measured'])} (model {ms(block['attention_s']['model'])}, "
            f"{bound} hops; median x{'-' if ratio is None else f'{ratio:.3f}'}), "
            f"{'-' if hops is None else f'{hops:g}'} hops a layer, blocks at scale {block['scale']:.4g}; TTFT p50 "
            f"ring {ring_p50} vs other {other_p50}")
    return [line, *(f"ring FAILED: {reason}" for reason in block["failures"])]


def ring_gaps(prefills: list[dict], scenario: Scenario) -> dict[str, fidelity.Gap]:
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




class RingReport(FlowReport):
    KEY = "ring"

    def block(self, run: RunData) -> dict[str, Any] | None:
        """The ring class's attention round its rings beside the model, its TTFT (None without a ring class)."""
        return ring_summary(run.scenario, list(run.records), list(run.prefills))

    def fidelity(self, run: RunData) -> dict[str, fidelity.Gap]:
        return ring_gaps(list(run.prefills), run.scenario) if RingSection.of(run.scenario).on else {}

    def lines(self, report: Mapping[str, Any]) -> list[str]:
        return ring_line(report.get(self.KEY))

    def columns(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """Ring attention's headline figures (extra CSV columns), for runs with --ring-share (the sweep axes
        `--grid ring_ranks=2,4,8 --grid ring_link=eth-25g,eth-100g,nvlink4`)."""
        block = report.get("ring")
        if not block:
            return {}
        ttft = block["ttft_ms"]
        return {"ring_ranks": block["ranks"], "ring_link": block["link"],
                "ring_attention_ms": ms(block["attention_s"]["measured"]),
                "model_ring_attention_ms": ms(block["attention_s"]["model"]),
                "ring_ttft_p50_ms": ttft["ring"]["p50"] if ttft["ring"] else None,
                "other_ttft_p50_ms": ttft["other"]["p50"] if ttft["other"] else None}


REPORT = RingReport()
