"""The one place that opens a trace file: model/serving/traces.py's parsers are pure and take lines.

`scenario.trace` is a shipped trace's name (`mooncake-conversation`, `mooncake-synthetic`: kvtransit/data/traces/,
with their provenance and licence) or any path; a `.gz` file is decompressed as it is read. The load generator
replays the window it gives (workload/source.py); the pool warms from the requests before it
(flows/tier/pool/warm.py, --pool-warm trace).
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TextIO

from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.traces import SHIPPED_TRACES, TraceError, TraceReplay, detect_format, parse_trace, replay
from kvtransit.paths import DATA

SHIPPED_DIR = DATA / "traces"


def trace_path(trace: str) -> Path:
    """The file behind `--trace`: a shipped trace's, by its name, else the path as given."""
    return SHIPPED_DIR / SHIPPED_TRACES[trace] if trace in SHIPPED_TRACES else Path(trace)


def open_trace(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def load_trace(scenario: Scenario) -> TraceReplay:
    path = trace_path(scenario.trace)
    fmt = detect_format(scenario.trace) if scenario.trace_format == "auto" else scenario.trace_format
    try:
        with open_trace(path) as handle:
            records = parse_trace(handle, fmt, source=scenario.trace)
    except (OSError, EOFError) as exc:  # EOFError: a truncated .gz
        raise TraceError(f"trace: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return replay(records, requests=scenario.requests, time_scale=scenario.time_scale,
                  sampling=scenario.trace_sample, context_cap=scenario.context_cap, seed=scenario.seed,
                  source=scenario.trace, start=scenario.trace_start)
