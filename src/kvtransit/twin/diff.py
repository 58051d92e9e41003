"""A live run against its twin, request by request (`attach_twin`: the harness joins it into every live report).

Both runs see the same requests in the same order (the same seed: workload/source.py `requests_for`), so request `id`
is the same request in both. For each request both finished, the difference (live − twin) of each figure the report
keeps (`per_request`: TTFT, TPOT, E2E, hand-off, decode queue wait), and of the one it implies, the decode steps'
share of E2E (E2E − TTFT − hand-off − decode wait). Each is a **stage** of the request's life, in order:

- `prefill`: TTFT, the prefill queue and step hold (docs/reference.md §4: the first token at its step's end);
- `link`: the hand-off, KV ready − first token (the link's queue, the wire, the module in transit);
- `decode admission`: KV ready → admitted into decode's continuous batch;
- `decode steps`: admitted → the last token.

The diff says how each metric's differences are distributed, the requests where the two part most (by |Δ E2E|, with
the moment, their arrival, and the stage that holds the largest share of the difference), how the total departure
divides among the stages, and which requests ended differently (one ok, the other not). The twin's figures sit in
each live `per_request` row under `twin`. Pure: reports in, a block out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.slo import distribution
from kvtransit.model.scenario import Scenario
from kvtransit.report.finite import finite_json
from kvtransit.twin.report import twin_report
from kvtransit.twin.serving import run_twin, unmodelled_flows

METRICS = ("ttft_s", "tpot_s", "e2e_s", "handoff_s", "decode_wait_s")
STAGES = {"prefill": "ttft_s", "link": "handoff_s", "decode admission": "decode_wait_s",
          "decode steps": "decode_steps_s"}
PARTINGS = 10  # requests listed where live and twin part most


def _spread(values: list[float]) -> dict[str, float | int]:
    """A difference's distribution: `distribution`'s figures, with its minimum (a difference runs both ways) and
    how many requests it counts."""
    return {**distribution(values), "min": min(values) if values else math.nan, "count": len(values)}


def _decode_steps_s(row: Mapping[str, Any]) -> float | None:
    parts = [row.get(k) for k in ("e2e_s", "ttft_s", "handoff_s", "decode_wait_s")]
    if any(p is None for p in parts):
        return None
    e2e, ttft, handoff, wait = (float(p) for p in parts)  # type: ignore[arg-type]
    return e2e - ttft - handoff - wait


def _stage_figures(row: Mapping[str, Any]) -> dict[str, float | None]:
    return {**{k: row.get(k) for k in METRICS}, "decode_steps_s": _decode_steps_s(row)}


def stage_deltas(live: Mapping[str, Any], twin: Mapping[str, Any]) -> dict[str, float] | None:
    """One request's live − twin in each stage (STAGES), or None when either run has a stage unmeasured (a request
    that did not finish, or handed nothing off)."""
    mine, theirs = _stage_figures(live), _stage_figures(twin)
    if any(mine[key] is None or theirs[key] is None for key in STAGES.values()):
        return None
    return {stage: mine[key] - theirs[key] for stage, key in STAGES.items()}  # type: ignore[operator]


def diff_runs(live: Mapping[str, Any], twin: Mapping[str, Any], partings: int = PARTINGS) -> dict[str, Any]:
    """The diff block of a live report against its twin's (module docstring); every time in model seconds."""
    twin_rows = {row["id"]: row for row in twin["per_request"]}
    deltas: dict[str, list[float]] = {k: [] for k in (*METRICS, "decode_steps_s")}
    stage_abs = dict.fromkeys(STAGES, 0.0)
    parted: list[dict[str, Any]] = []
    outcomes: list[dict[str, Any]] = []
    missing = 0
    for row in live["per_request"]:
        other = twin_rows.get(row["id"])
        if other is None:
            missing += 1
            continue
        if row["outcome"] != other["outcome"]:
            outcomes.append({"id": row["id"], "live": row["outcome"], "twin": other["outcome"],
                             "live_failure": row.get("failure")})
        mine, theirs = _stage_figures(row), _stage_figures(other)
        delta = {k: mine[k] - theirs[k] for k in mine if mine[k] is not None and theirs[k] is not None}  # type: ignore[operator]
        for key, value in delta.items():
            deltas[key].append(value)
        if all(STAGES[s] in delta for s in STAGES):
            for stage, key in STAGES.items():
                stage_abs[stage] += abs(delta[key])
            largest = max(STAGES, key=lambda s: abs(delta[STAGES[s]]))
            parted.append({"id": row["id"], "arrival_s": row["arrival_s"], "e2e_delta_s": delta["e2e_s"],
                           "stage": largest, **{f"{s}_delta_s": delta[STAGES[s]] for s in STAGES}})
    total_abs = math.fsum(stage_abs.values())
    parted.sort(key=lambda p: abs(p["e2e_delta_s"]), reverse=True)
    return {
        "compared": len(parted),
        "live_only": missing,
        "delta_s": {k: _spread(v) for k, v in deltas.items()},  # live − twin
        "stage_share": {s: (v / total_abs if total_abs > 0 else None) for s, v in stage_abs.items()},
        "partings": parted[:partings],
        "outcomes_differ": outcomes,
        "summary": {k: {"live": live.get(k, {}).get("p99"), "twin": twin.get(k, {}).get("p99")}
                    for k in ("ttft_s", "tpot_s", "e2e_s", "handoff_s")}
        | {"slo_attainment": {"live": live.get("slo_attainment"), "twin": twin.get("slo_attainment")}},
    }


def attach_twin(report: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """Run the scenario's twin and join it into the live `report`: the twin's figures in each `per_request` row
    (`twin`), the diff under `twin`. A scenario the twin cannot model gets `twin.refused` (the flows and why)."""
    gaps = unmodelled_flows(scenario)
    if gaps:
        report["twin"] = {"refused": "; ".join(gaps)}
        return report
    try:
        twin = twin_report(run_twin(scenario), wall_s=None)
    except ConfigError as exc:
        report["twin"] = {"refused": str(exc)}
        return report
    by_id = {row["id"]: row for row in twin["per_request"]}
    for row in report["per_request"]:
        other = by_id.get(row["id"])
        row["twin"] = None if other is None else {**{k: other[k] for k in (*METRICS, "outcome")},
                                                  "stage_delta_s": stage_deltas(row, other)}
    # A difference with no request to count (a run whose requests all failed) is NaN: null in the JSON, as in the
    # rest of the report.
    report["twin"] = finite_json({"source": "twin", "events": twin["twin_run"]["events"], **diff_runs(report, twin)})
    return report
