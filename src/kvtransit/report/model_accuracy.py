"""The report's `accuracy.model` block (`--kv-sample real`): what the real model read of the KV that crossed the link,
pooled over the decode instances' readings (agents/decode/model_accuracy.py), and the errors it names when asked for
and not (all) measured. The load generator waits for the readings before it builds the report
(agents/loadgen/model_accuracy_wait.py)."""

from __future__ import annotations

from typing import Any

from kvtransit.model.scenario import Scenario
from kvtransit.realmodel import live
from kvtransit.report.peer_stats import stat_sum


def model_accuracy_block(scenario: Scenario, prefills: list[dict], decodes: list[dict]) -> dict[str, Any]:
    """The pooled figures (module docstring), the requests read and how, and why any was not."""
    blocks = [d["accuracy_model"] for d in decodes if isinstance(d.get("accuracy_model"), dict)]
    sums = {key: stat_sum(blocks, "sums", key) for key in live.SUMS}
    carried: dict[str, Any] = {}
    capped: list[int] = []
    model_names = {b["model"] for b in blocks if b.get("model")}
    for p in prefills:
        real: dict[str, Any] = p["real_kv"] if isinstance(p.get("real_kv"), dict) else {}
        carried.update(real.get("requests", {}))
        capped += real.get("capped", [])
        if real.get("model"):
            model_names.add(real["model"])
    per_request = {rid: {**carried.get(rid, {}), **reading} for b in blocks
                   for rid, reading in b.get("per_request", {}).items()}
    failed = {rid: reason for b in blocks for rid, reason in b.get("failed", {}).items()}
    failures = sorted({b["failure"] for b in blocks if b.get("failure")})
    return {
        "mode": scenario.accuracy,
        "model": ", ".join(sorted(model_names)) or None,
        "requests": scenario.real_kv_requests,
        "measured": len(per_request),
        "pending": int(stat_sum(blocks, "pending")),
        "failed": failed,
        "failures": failures,
        "raw_mismatches": int(stat_sum(blocks, "raw_mismatches")),
        "context_tokens_max": live.CONTEXT_MAX,
        "continuation_tokens": live.CONTINUATION if scenario.accuracy == "model" else None,
        "windows": sorted({w.name for w in map(live.window_for, range(scenario.real_kv_requests))}),
        "scored_tokens": int(sums["scored"]),
        **live.figures(sums),
        "capped_requests": sorted(capped),
        "per_request": dict(sorted(per_request.items(), key=lambda kv: int(kv[0]))),
    }


def model_accuracy_errors(block: dict[str, Any]) -> list[str]:
    """What the report's `errors` say about the real model's reading: asked for and not (all) measured."""
    errors = [f"accuracy model: request {rid} not read: {reason}" for rid, reason in sorted(
        block["failed"].items(), key=lambda kv: int(kv[0]))]
    errors += [f"accuracy model: {failure}" for failure in block["failures"]]
    if block["pending"]:
        errors.append(f"accuracy model: {block['pending']} reading(s) still pending when the report was written")
    if block["measured"] == 0 and not errors:
        errors.append("accuracy model: not measured: no real-KV hand-off reached decode")
    return errors
