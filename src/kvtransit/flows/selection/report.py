"""The report's `remote_kv` block (`--kv-placement remote`): the long-context class's remote KV as decode fetched it,
beside the model, and what it cost the class's TPOT; None without remote KV.

Joined from decode's /stats (`remote_kv`, flows/selection/decode_legs.py), the middlebox's (the module's scoring) and
the pool's; the class's TPOT is the client's own, split by the pure class rule (flows/selection/remote_class.py:
in_remote_class). Bytes are model bytes (× 1/scale); seconds model seconds. The legs are judged on the steps that had
the link to themselves (no hand-off on it), at the bytes they moved: measured / model (flows/selection/remote_class.py:
legs_model_s).
"""

from __future__ import annotations

from typing import Any

from kvtransit.model.judge.slo import RequestRecord, distribution
from kvtransit.model.scenario import Scenario


def _tpot_ms(records: list[RequestRecord]) -> dict[str, float] | None:
    values = [r.tpot_s * 1e3 for r in records if r.tpot_s is not None]
    return distribution(values) if values else None


def remote_kv_summary(scenario: Scenario, records: list[RequestRecord], decodes: list[dict],
                      middleboxes: list[dict], pools: list[dict]) -> dict[str, Any] | None:
    if not scenario.remote_kv:
        return None
    stats = [d["remote_kv"] for d in decodes if isinstance(d.get("remote_kv"), dict)]
    step = scenario.selection_step
    check = scenario.scoring_check
    request_steps = sum(s["request_steps"] for s in stats)
    steps = sum(s["steps"] for s in stats)
    long = [r for r in records if scenario.is_remote_request(r.request_id)]
    short = [r for r in records if not scenario.is_remote_request(r.request_id)]
    ratios = [s["ratio_median"] for s in stats if s.get("ratio_median") is not None]
    return {
        "select": scenario.select_mode, "budget": step.budget, "summary": scenario.select_summary,
        "page_size": scenario.page_size, "context_tokens": scenario.remote_context, "share": scenario.remote_share,
        "scoring": None if check is None else check.describe(),
        "requests": {"remote": len(long), "local": len(short)},
        "tpot_ms": {"remote": _tpot_ms(long), "local": _tpot_ms(short)},
        "steps": steps,
        "idle_link_steps": sum(s["idle_link_steps"] for s in stats),
        # Per remote request and step, what crossed the decode link (the model's: flows/selection/model.py).
        "summary_bytes": {"measured": sum(s["summary_bytes"] for s in stats) / request_steps if request_steps
                          else None, "model": step.summary_bytes},
        "page_bytes": {"measured": sum(s["page_bytes"] for s in stats) / request_steps if request_steps else None,
                       "model": step.chosen_kv_bytes if step.budget is not None else step.all_kv_bytes},
        "reduction_vs_all": step.reduction,
        "legs_s": {"measured": sum(s["legs_seconds"] for s in stats) / steps if steps else None,
                   "model": sum(s["model_seconds"] for s in stats) / steps if steps else None},
        # The worst decode's median over its idle-link steps, and p99 (measured / model at the bytes moved).
        "legs_ratio_median": max(ratios, key=lambda r: abs(r - 1)) if ratios else None,
        "legs_ratio_p99": max((s["ratio_p99"] for s in stats if s.get("ratio_p99") is not None), default=None),
        "late_s": sum(s["late_s"] for s in stats),
        "scored_bytes": sum(m.get("remote_kv", {}).get("scored_bytes", 0.0) for m in middleboxes),
        "made_on_demand": sum(p.get("remote_kv", {}).get("made_on_demand", 0) for p in pools),
        "failures": {k: v for s in stats for k, v in s["failures"].items()},
        "shared_handoffs": sum(len(s.get("shared_handoffs", [])) for s in stats),
    }


def shared_handoffs(decodes: list[dict]) -> set[int]:
    """Request ids of hand-offs that met remote legs on the link (not on an idle link, for the hand-off check)."""
    return {rid for d in decodes for rid in (d.get("remote_kv") or {}).get("shared_handoffs", [])}


def remote_kv_line(block: dict | None) -> list[str]:
    if not block:
        return []

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.3g} ms"

    def mb(nbytes: float | None) -> str:
        return "-" if nbytes is None else f"{nbytes / 1e6:.4g} MB"

    tpot = block["tpot_ms"]
    remote, local = (f"{t['p50']:.3g}" if t else "-" for t in (tpot["remote"], tpot["local"]))
    what = (f"top-k {block['budget']:.4g} of {block['summary']} pages" if block["select"] == "top-k"
            else "every token")
    ratio = block["legs_ratio_median"]
    median = "-" if ratio is None else f"{ratio:.3f}"
    legs, summaries, pages = block["legs_s"], block["summary_bytes"], block["page_bytes"]
    return [(f"remote KV ({what}, {block['context_tokens']}-token contexts, {block['requests']['remote']} remote "
             f"requests): a step's legs {ms(legs['measured'])} (model {ms(legs['model'])}; idle-link median "
             f"x{median}), per request-step {mb(summaries['measured'])} of summaries + {mb(pages['measured'])} of "
             f"pages; TPOT p50 remote {remote} ms vs local {local} ms")]
