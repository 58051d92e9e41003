"""Sweeps run live: every point of a grid is a real run of the testbed through the `Launcher`, and each
point's report is boiled down to one row of a results file that a later sweep resumes from.

- `ResultsStore`: `results.json` (the rows, the source of truth) and `results.csv` beside it (the same rows,
  flat). A point whose key is already there is not run again unless asked (`rerun=True`). Each point's own
  report (JSON + Markdown) stays in `points/` beside them.
- `run_sweep`: the points in order, one live run each; a point that fails is recorded as failed (with the
  reason) and the sweep goes on.
- `TwinPointRunner`: a point on the twin instead (twin/): the same row from the twin's report, in seconds of wall
  time a grid, `source` "twin"; its store is OUT/twin/, apart from the live rows.
- `search_goodput`: DistServe's per-instance goodput by bisection over live runs (`model.sweep_plan.bisect_goodput`),
  reusing any rate already in the results file.
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvtransit.harness.studies.sweep.plan import GoodputSearch, Grid, bisect_goodput, canonical_key, codec_label
from kvtransit.harness.up.launcher import Launcher, RunFailed
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario, scenario_fields
from kvtransit.model.serving.layerwise import HANDOFF_WHOLE
from kvtransit.report.blocks import flow_reports
from kvtransit.runtime.signals import run_until_signalled
from kvtransit.workload.source import load_trace

# What a row says about its run, in the order the CSV lists them (model terms, milliseconds where "_ms"). New
# columns go at the end: a results file is read by name, but a spreadsheet of an older one by position.
METRIC_COLUMNS = ("link_busy", "handoff_p99_ms", "ttft_p99_ms", "tpot_p99_ms", "slo_attainment", "goodput_rps",
                  "j_per_token", "wire_bytes", "faithful", "kv_wait_share", "placement", "exposed_share",
                  "hidden_bytes_share")
# The point's parameters every row carries, besides its grid overrides.
PARAMETER_COLUMNS = ("link", "codec", "compress_at", "rate", "requests", "effective_scale", "effective_dilation",
                     "ttft_slo_ms", "tpot_slo_ms", "trace")
RUN_COLUMNS = ("key", "status", "error", "wall_s", "report")
RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def row_from_report(key: str, scenario: Scenario, report: dict, *, wall_s: float, report_path: Path) -> dict:
    """One results row: the point's parameters, its headline metrics, where its full report is."""
    return {
        "key": key, "status": "ok", "error": "", "wall_s": wall_s, "report": str(report_path),
        **_parameters(scenario),
        "link_busy": report["link"]["busy"],
        "handoff_p99_ms": _ms(report["handoff_s"]["p99"]),
        "ttft_p99_ms": _ms(report["ttft_s"]["p99"]),
        "tpot_p99_ms": _ms(report["tpot_s"]["p99"]),
        "slo_attainment": report["slo_attainment"],
        "goodput_rps": report["goodput_rps"],
        "j_per_token": report["j_per_token"],
        "wire_bytes": report["link"]["wire_bytes"],
        "faithful": report["faithful"],
        "kv_wait_share": report.get("kv_wait_share"),
        "placement": placement(report),
        # The hand-off split: the exposed share of its time, the share of its bytes that hid before the
        # first token (None for a report written before the split existed).
        "exposed_share": (report.get("handoff_split") or {}).get("exposed_share"),
        "hidden_bytes_share": (report.get("handoff_split") or {}).get("hidden_bytes_share"),
        # Each flow's headline figures (report/blocks.py: `columns`), for runs that turn it on.
        **{key: value for flow in flow_reports() for key, value in flow.columns(report).items()},
    }


def placement(report: dict) -> str | None:
    """Where the point ran and who shaped its link's rate, e.g. "netns (tc tbf)" or "loopback (userspace)": the
    launcher's `config.links` (None for a report written without a launcher)."""
    links = report.get("config", {}).get("links")
    if not links:
        return None
    return f"{links['mode']} ({links['backends']['rate']})"


def failed_row(key: str, scenario: Scenario, error: str, *, wall_s: float) -> dict:
    return {"key": key, "status": "failed", "error": error, "wall_s": wall_s, "report": "",
            **_parameters(scenario), **dict.fromkeys(METRIC_COLUMNS)}


def handoff_label(scenario: Scenario) -> str:
    """How the hand-off was released, for a table's column heading: "" for the reference model's (whole, no
    chunking), else e.g. " layerwise" or " whole, chunks 2048"."""
    parts = [scenario.handoff] if scenario.handoff != HANDOFF_WHOLE or scenario.prefill_chunk else []
    if scenario.prefill_chunk:
        parts.append(f"chunks {scenario.prefill_chunk}")
    return " " + ", ".join(parts) if parts else ""


def offered_rate(scenario: Scenario) -> float:
    """A point's load in req/s: the drawn workload's rate, or a trace window's mean arrival rate as replayed (its
    `rate` field is not used then), to 2 decimals: the tables' row label."""
    if not scenario.trace:
        return scenario.rate
    replayed = load_trace(scenario).applied["mean_rate_rps"]
    return round(replayed, 2) if replayed is not None else scenario.rate


def _parameters(scenario: Scenario) -> dict:
    return {"link": scenario.link, "codec": scenario.codec, "compress_at": scenario.compress_at,
            "codec_label": codec_label(scenario.codec, scenario.compress_at) + handoff_label(scenario),
            "handoff": scenario.handoff, "prefill_chunk": scenario.prefill_chunk, "rate": offered_rate(scenario),
            "requests": scenario.requests, "effective_scale": scenario.effective_scale,
            "effective_dilation": scenario.effective_dilation, "ttft_slo_ms": scenario.ttft_slo_ms,
            "tpot_slo_ms": scenario.tpot_slo_ms, "trace": scenario.trace, "scenario": scenario.as_dict()}


class ResultsStore:
    """The rows of a sweep, keyed by point, saved after every point (a crash loses at most the one running)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.json_path = self.directory / RESULTS_JSON
        self.csv_path = self.directory / RESULTS_CSV
        self.rows: dict[str, dict] = {}
        if self.json_path.exists():
            try:
                rows = json.loads(self.json_path.read_text())["rows"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{self.json_path}: not a kvtransit results file ({exc})") from None
            self.rows = {row["key"]: row for row in rows}

    def done(self, key: str, scenario: Scenario) -> bool:
        """A successful row for this very scenario (a failed one, or one run with other settings, is run again)."""
        row = self.rows.get(key, {})
        if row.get("status") != "ok":
            return False
        # A field added to Scenario since the row was written counts as its default (an upgrade reruns nothing).
        stored, defaults = row.get("scenario") or {}, _field_defaults()
        return all(stored.get(name, defaults.get(name)) == value for name, value in scenario.as_dict().items())

    def add(self, row: dict) -> None:
        self.rows[row["key"]] = row
        self.save()

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        rows = list(self.rows.values())
        _atomic_write(self.json_path, json.dumps({"rows": rows}, indent=1, allow_nan=False) + "\n")
        columns = [*RUN_COLUMNS, *PARAMETER_COLUMNS, "codec_label", *METRIC_COLUMNS]
        extra = sorted({k for row in rows for k in row} - set(columns) - {"scenario"})
        tmp = self.csv_path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=[*columns, *extra], extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.csv_path)


def _field_defaults() -> dict:
    return {f.name: f.default for f in scenario_fields()}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _clean(row: dict) -> dict:
    """NaN (no data) → None, so the JSON stays strict."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:150] or "base"


class SweepInterrupted(Exception):
    """SIGINT or SIGTERM during a point: its run was stopped (every process, namespace and link it made cleaned
    up), the point is not recorded, and the sweep stops; the rows before it are kept, so the same command resumes."""


@dataclass
class PointRunner:
    """Runs one scenario live and returns its row. `links`: the Launcher's links mode, `auto` as `kvtransit up`
    (namespaces + tc where this host can: loopback's user-space shaper falls short of the link's rate)."""

    directory: Path
    links: str = "auto"
    accuracy_sample: int = 2
    drain_timeout_s: float | None = None
    log: Callable[[str], None] = lambda _line: None
    on_progress: Callable[[dict], None] | None = None
    runs: int = field(default=0, init=False)

    def __call__(self, key: str, scenario: Scenario) -> dict:
        report_path = self.directory / "points" / f"{_slug(key)}.json"
        launcher = Launcher(scenario, report_path=report_path, accuracy_sample=self.accuracy_sample,
                            drain_timeout_s=self.drain_timeout_s, on_progress=self.on_progress, log=self.log,
                            links=self.links)
        started = time.monotonic()
        self.runs += 1

        async def run(stop: asyncio.Event) -> tuple[Path | None, bool]:
            return await launcher.run(stop), stop.is_set()

        try:
            path, interrupted = asyncio.run(run_until_signalled(run))
        except RunFailed as exc:
            return failed_row(key, scenario, str(exc).splitlines()[0], wall_s=time.monotonic() - started)
        wall_s = time.monotonic() - started
        if interrupted:
            raise SweepInterrupted(f"interrupted during point {key}: not recorded")
        if path is None:
            return failed_row(key, scenario, "the run ended without a report", wall_s=wall_s)
        return _clean(row_from_report(key, scenario, json.loads(Path(path).read_text()), wall_s=wall_s,
                                      report_path=path))


@dataclass
class TwinPointRunner:
    """Runs one scenario on the twin and returns its row (`source` "twin"); its report goes to points/ beside the
    twin's results, without figures (a grid of hundreds of points draws none)."""

    directory: Path
    runs: int = field(default=0, init=False)

    def __call__(self, key: str, scenario: Scenario) -> dict:
        from kvtransit.report.build import write_report
        from kvtransit.twin.report import twin_report
        from kvtransit.twin.serving import SOURCE, run_twin

        report_path = self.directory / "points" / f"{_slug(key)}.json"
        started = time.monotonic()
        self.runs += 1
        try:
            twin = run_twin(scenario)
        except ConfigError as exc:
            return {**failed_row(key, scenario, str(exc), wall_s=time.monotonic() - started), "source": SOURCE}
        wall_s = time.monotonic() - started
        report = twin_report(twin, wall_s=wall_s)
        write_report(report, report_path, figures=False)
        return {**_clean(row_from_report(key, scenario, report, wall_s=wall_s, report_path=report_path)),
                "source": SOURCE}


def sweep_points(grids: list[Grid]) -> list[tuple[str, Scenario]]:
    """Every grid's points as (key, scenario), scenarios checked up front (a bad value fails before any run).
    A point two grids share is run once; two different scenarios under one key are an error."""
    out: list[tuple[str, Scenario]] = []
    seen: dict[str, Scenario] = {}
    for grid in grids:
        for point in grid.points():
            scenario = grid.scenario(point)
            key = canonical_key(scenario, grid.axes)
            if key in seen:
                if seen[key] != scenario:
                    raise ConfigError(f"sweep: two grids have point {key} with different scenarios; give them an axis "
                                      "that tells them apart")
                continue
            seen[key] = scenario
            out.append((key, scenario))
    for trace in {s.trace for _, s in out if s.trace}:  # a bad trace fails here, not at every point's load generator
        load_trace(next(s for _, s in out if s.trace == trace))
    return out


def run_sweep(points: list[tuple[str, Scenario]], store: ResultsStore, run_point: Callable[[str, Scenario], dict], *,
              rerun: bool = False, on_start: Callable[[int, str, Scenario, bool], None] | None = None,
              on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Run every point not already done (all of them with `rerun`); the rows of all points, in order."""
    rows = []
    for index, (key, scenario) in enumerate(points):
        skip = store.done(key, scenario) and not rerun
        if on_start is not None:
            on_start(index, key, scenario, skip)
        if not skip:
            store.add(run_point(key, scenario))
        rows.append(store.rows[key])
        if on_done is not None:
            on_done(index, store.rows[key])
    return rows


def search_goodput(base: Scenario, store: ResultsStore, run_point: Callable[[str, Scenario], dict], *, lo: float,
                   hi: float, target: float, iterations: int, rerun: bool = False,
                   on_start: Callable[[int, str, Scenario, bool], None] | None = None) -> GoodputSearch:
    """Bisection over live runs at `base` with only the rate changed; every run lands in `store`."""

    counter = {"n": 0}

    def key_of(rate: float) -> tuple[str, Scenario]:
        scenario = base.replace(rate=round(rate, 4))  # keys stay readable; a resumed search finds the same points
        return canonical_key(scenario, {}), scenario

    def attainment_at(rate: float) -> float:
        key, scenario = key_of(rate)
        skip = store.done(key, scenario) and not rerun
        if on_start is not None:
            on_start(counter["n"], key, scenario, skip)
        counter["n"] += 1
        if not skip:
            store.add(run_point(key, scenario))
        value = store.rows[key]["slo_attainment"]
        return math.nan if value is None else value

    def faithful_at(rate: float) -> bool:
        return store.rows[key_of(rate)[0]].get("faithful") is True  # a failed run was not faithful either

    return bisect_goodput(attainment_at, lo, hi, target=target, iterations=iterations, faithful_at=faithful_at)
