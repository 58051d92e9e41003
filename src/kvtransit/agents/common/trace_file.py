"""The one place that opens a trace file: model/traces.py's parsers are pure and take lines.

The load generator replays the window it gives (agents/loadgen/workload_source.py); the pool warms from the
requests before it (agents/kvpool/warm.py, --pool-warm trace).
"""

from __future__ import annotations

from pathlib import Path

from kvtransit.model.scenario import Scenario
from kvtransit.model.traces import TraceError, TraceReplay, detect_format, parse_trace, replay


def load_trace(scenario: Scenario) -> TraceReplay:
    path = Path(scenario.trace)
    fmt = detect_format(scenario.trace) if scenario.trace_format == "auto" else scenario.trace_format
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            records = parse_trace(handle, fmt, source=str(path))
    except OSError as exc:
        raise TraceError(f"trace: cannot read {path}: {exc.strerror or exc}") from None
    return replay(records, requests=scenario.requests, time_scale=scenario.time_scale,
                  sampling=scenario.trace_sample, context_cap=scenario.context_cap, seed=scenario.seed,
                  source=str(path), start=scenario.trace_start)
