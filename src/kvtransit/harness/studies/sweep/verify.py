"""`kvtransit sweep --twin --verify N`: which of a twin grid's points to run live, and the twin beside the live run.

A twin grid (runner.py: `TwinPointRunner`) answers in seconds; live runs take the real time. So the live runs go where
the answer is decided (`choose_points`): first the **frontier**, the pairs of neighbouring loads of one series (every
field but the rate the same) between which the SLO attainment crosses the target, both sides; then the points whose
attainment lies nearest the target. Each chosen point runs live as any sweep point does (its report carries its own
diff against the twin, request by request: twin/diff.py), and `comparison` sets them side by side, the largest
disagreements first (SLO attainment, then the hand-off p99), with the stage where the live run departed most.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# (row key, heading, how a value prints) of the twin-vs-live table.
COMPARED = (
    ("slo_attainment", "SLO attainment", lambda v: f"{v:.1%}"),
    ("ttft_p99_ms", "TTFT p99 ms", lambda v: f"{v:.1f}"),
    ("tpot_p99_ms", "TPOT p99 ms", lambda v: f"{v:.2f}"),
    ("handoff_p99_ms", "hand-off p99 ms", lambda v: f"{v:.1f}"),
    ("link_busy", "link busy", lambda v: f"{v:.1%}"),
)


def _series(row: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in (row.get("scenario") or {}).items() if k != "rate"}, sort_keys=True)


def choose_points(rows: Sequence[Mapping[str, Any]], count: int, target: float) -> list[str]:
    """The keys of at most `count` twin rows to run live (module docstring), in that order."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("slo_attainment") is not None]
    series: dict[str, list[Mapping[str, Any]]] = {}
    for row in ok:
        series.setdefault(_series(row), []).append(row)
    chosen: list[str] = []
    for members in series.values():
        members.sort(key=lambda r: r["rate"])
        for low, high in itertools.pairwise(members):
            if (low["slo_attainment"] >= target) != (high["slo_attainment"] >= target):
                chosen += [k for k in (low["key"], high["key"]) if k not in chosen]
    rest = sorted((r for r in ok if r["key"] not in chosen), key=lambda r: abs(r["slo_attainment"] - target))
    chosen += [r["key"] for r in rest]
    return chosen[:count]


def _departure(live: Mapping[str, Any]) -> str:
    """The stage holding most of the live run's departure from its twin (its report's `twin` block), or why none."""
    try:
        block = json.loads(Path(live["report"]).read_text()).get("twin") or {}
    except (OSError, ValueError, KeyError):
        return "-"
    if "refused" in block:
        return f"no twin ({block['refused']})"
    shares = {s: v for s, v in (block.get("stage_share") or {}).items() if v is not None}
    if not shares:
        return "-"
    stage = max(shares, key=lambda s: shares[s])
    return f"{stage} ({shares[stage]:.0%})"


def comparison(twin_rows: Mapping[str, Mapping[str, Any]], live_rows: Mapping[str, Mapping[str, Any]],
               keys: Sequence[str]) -> list[dict[str, Any]]:
    """One entry per verified point (twin row, live row, the live run's departure), largest disagreement first."""
    out = []
    for key in keys:
        twin, live = twin_rows[key], live_rows.get(key)
        if live is None:
            continue
        slo = [r.get("slo_attainment") for r in (twin, live)]
        handoff = [r.get("handoff_p99_ms") for r in (twin, live)]
        out.append({"key": key, "twin": twin, "live": live,
                    "slo_gap": abs(slo[1] - slo[0]) if None not in slo else 0.0,  # type: ignore[operator]
                    "handoff_gap": (abs(handoff[1] - handoff[0]) / handoff[0]
                                    if None not in handoff and handoff[0] else 0.0),
                    "departure": _departure(live) if live.get("status") == "ok" else "-"})
    out.sort(key=lambda e: (e["slo_gap"], e["handoff_gap"]), reverse=True)
    return out


def comparison_markdown(entries: Sequence[Mapping[str, Any]]) -> str:
    """The twin-vs-live table: per point, each figure as twin / live, the live run's faithful and departure."""
    lines = ["# kvtransit sweep: the twin against live runs", "",
             ("Each cell twin / live (model terms). The twin's figures are the model's on a virtual clock; the live "
              "run's were measured (scaled and dilated as its `faithful` column's run says). Largest disagreement "
              "first; `departs most in`: the stage that holds most of the live run's per-request difference from "
              "its twin (its report's `twin` block)."), "",
             "| point | " + " | ".join(h for _, h, _ in COMPARED) + " | live faithful | departs most in |",
             "|---|" + "---|" * (len(COMPARED) + 2)]

    def cell(value, fmt) -> str:
        return "-" if value is None else fmt(value)

    for entry in entries:
        twin, live = entry["twin"], entry["live"]
        if live.get("status") != "ok":
            lines.append(f"| {entry['key']} | " + " | ".join("-" for _ in COMPARED)
                         + f" | failed: {live.get('error', '')[:60]} | - |")
            continue
        cells = [f"{cell(twin.get(k), f)} / {cell(live.get(k), f)}" for k, _, f in COMPARED]
        faithful = "yes" if live.get("faithful") else "NO"
        lines.append(f"| {entry['key']} | " + " | ".join(cells) + f" | {faithful} | {entry['departure']} |")
    return "\n".join(lines) + "\n"
