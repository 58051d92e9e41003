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
from typing import Any

from kvtransit.model.judge.slo import Outcome, RequestRecord, distribution
from kvtransit.model.scenario import Scenario


def _ttft_ms(records: list[RequestRecord]) -> dict[str, float] | None:
    values = [r.ttft_s * 1e3 for r in records if r.ttft_s is not None]
    return distribution(values) if values else None


def ring_ratio_median(stats: dict) -> float | None:
    """One prefill's median of measured / model attention over its ring requests (None: none ran); every ring
    request's model attention is the same (`model_s`)."""
    measured = stats.get("measured_s") or []
    return statistics.median(measured) / stats["model_s"] if measured else None


def ring_summary(scenario: Scenario, records: list[RequestRecord], prefills: list[dict]) -> dict[str, Any] | None:
    if not scenario.ring:
        return None
    stats = [p["ring"] for p in prefills if isinstance(p.get("ring"), dict)]
    model = scenario.ring_model
    measured = [m for s in stats for m in s["measured_s"]]
    ring = [r for r in records if scenario.is_ring_request(r.request_id)]
    other = [r for r in records if not scenario.is_ring_request(r.request_id)]
    prompts = sum(len(s["measured_s"]) for s in stats)
    hops = sum(s["hops"] for s in stats)
    ratios = [x for x in (ring_ratio_median(s) for s in stats) if x is not None]
    return {
        "ranks": scenario.ring_ranks, "link": scenario.ring_link, "prompt_tokens": scenario.ring_prompt,
        "block_tokens": model.block_tokens, "share": scenario.ring_share,
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
        "hop_bytes": sum(s["raw_bytes"] for s in stats) / scenario.ring_scale,
        "scale": scenario.ring_scale,
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
