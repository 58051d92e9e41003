"""`kvtransit candidates`' harness: one short scenario per candidate (docs/reference.md §8), each test measured from its
run, then each row's regime mapped by the model and confirmed live.

The rows are harness/studies/candidates/rows.py's `all_rows()`: the core's hand-off row (kv_rows.py) and each flow's
(a flow's `rows.py`). Each row function runs its flow and returns a `RowRun`: the figures
(`harness/studies/candidates/table.py: RowMeasured`) the five tests are judged from, the scale and dilation it ran at,
whether it was faithful, the command that reproduces it, its run directory, its small report (the evidence the table
commits), and two lines saying what was measured and what was modelled.

- kv-handoff: a short `kvtransit up` (Launcher, loopback), band-keep in transit, the real-KV sample; bottleneck =
  the report's kv_wait_share; precision = band-keep's task-level loss on SmolLM2 (docs/results/accuracy.json).
- kv-tier-fetch: the `tier-deck` preset's in-transit point (llama3-70b, 32k prefixes over eth-100g, the Mooncake
  trace's reuse from a warmed pool); bottleneck = fetch time / E2E.
- tp-all-reduce: `kvtransit collective`, TP4, a switch summing the ranks' streams; the measured all-reduce share;
  the sum asked of a pluggable (refused by the process); real partial sums' error against float64.
- moe-all-to-all: `kvtransit collective --ep 2 --dispatch fp8` (ring, the dispatch cast at the GPUs); the measured
  collective share × the model's all-to-all part; FP8's error on the real model's MLP inputs (the realkv extra).
- ring-attention: `kvtransit ring`, 4 ranks passing the real-KV sample's blocks round a shaped ring, raw and with
  band-keep on every hop; the measured prompt's time beyond its held attention; band-keep's task-level loss.
- pq-key-exchange: ML-KEM-768 handshakes over a shaped loopback link (the compiled KEM); the link time over the
  session the handshake opens.
- fhe-inference: the CKKS encrypted layer over the same link (TenSEAL); (up + down) / request time; CKKS's own
  kernel declaration.
- query-aware-selection: `kvtransit select`, a pool, the module scoring the pages' summaries in transit and decode
  over a shaped link, top-k and every token; the every-token fetch's measured share of its step, the error of what
  arrived.
- weight-streaming: `kvtransit weights`, a store and an instance: the cold start, then adapters paged in on
  demand; the adapter waits' measured share of TTFT, every byte checked against what was sent.

Every live run goes through `regimes.run_until_faithful` (the seam for a retrying runner). A row whose own run, or
one of its regime's live points, was not faithful is "not settled" (`RowMeasured.unsettled`). Each row's five tests
are judged by `harness/studies/candidates/table.py`; this module only measures.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvtransit.harness.studies.candidates.regimes import (
    RegimeResult,
    confirm,
    map_regime,
    run_until_faithful,
    where_text,
)
from kvtransit.harness.studies.candidates.rows import (
    Row,
    RowContext,
    RowRun,
    all_rows,
    default_sample_path,
    not_run,
)
from kvtransit.harness.studies.candidates.table import Unknowns
from kvtransit.harness.studies.candidates.verdicts import judge_one
from kvtransit.model.errors import ConfigError

__all__ = ["REGIME_MODES", "default_sample_path", "parse_axes", "run_rows"]

REGIME_MODES = ("live", "model", "off")  # map and confirm live; map by the model only; neither


def _failed(ctx: RowContext, exc: Exception, command: str) -> RowRun:
    from kvtransit.model.catalog.codecs import codec_declaration

    return not_run(ctx, codec_declaration("none"), f"not run: the run failed: {type(exc).__name__}: {exc}", command)


def _run_row(row: Row, ctx: RowContext) -> RowRun:
    """The row's function at `ctx`; a run that raised is a row saying so (not run), not a crash of the table."""
    try:
        return row.run(ctx)
    except Exception as exc:
        return _failed(ctx, exc, f"kvtransit candidates --only {ctx.name}")


def _confirming(row: Row) -> Callable[[RowContext], RowRun]:
    """The row's function for a live point: a point whose run raised is a point that was not faithful."""
    def run(ctx: RowContext) -> RowRun:
        got = _run_row(row, ctx)
        if got.measured.not_run is not None:
            got.faithful = f"NO ({got.measured.not_run})"
        return got
    return run


def parse_axes(specs: list[str] | None, names: tuple[str, ...]) -> dict[str, dict[str, tuple[Any, ...]]]:
    """`--regime-axis ROW:KEY=V1,V2,...` (repeatable) → {row: {key: values}}, each checked against the row's axis
    and its catalogue (one line naming what is wrong)."""
    out: dict[str, dict[str, tuple[Any, ...]]] = {}
    rows = all_rows()
    for spec in specs or []:
        head, sep, values_text = spec.partition("=")
        name, colon, key = head.partition(":")
        if not sep or not colon or not values_text:
            raise ConfigError(f"--regime-axis {spec!r}: expected ROW:KEY=V1,V2,... (e.g. kv-handoff:rate=4,8,12)")
        if name not in rows:
            raise ConfigError(f"--regime-axis {spec!r}: unknown candidate {name!r} (choose from: {', '.join(rows)})")
        regime = rows[name].regime
        if regime is None:
            raise ConfigError(f"--regime-axis {spec!r}: {name} has no regime")
        axis = next((a for a in (regime.x, regime.y) if a.key == key), None)
        if axis is None:
            raise ConfigError(f"--regime-axis {spec!r}: {name}'s axes are {regime.x.key} and {regime.y.key}, not "
                              f"{key!r}")
        raw = [v.strip() for v in values_text.split(",") if v.strip()]
        values: list[Any] = []
        for v in raw:
            if axis.choices is not None and isinstance(axis.choices[0], str):
                values.append(v)
                continue
            try:
                values.append(type(axis.values[0])(float(v)) if isinstance(axis.values[0], int) else float(v))
            except ValueError:
                raise ConfigError(f"--regime-axis {spec!r}: {v!r} is not a number") from None
        try:
            regime.with_values(key, tuple(values))
        except ConfigError as exc:
            raise ConfigError(f"--regime-axis {spec!r}: {exc}") from None
        out.setdefault(name, {})[key] = tuple(values)
        if name not in names:
            raise ConfigError(f"--regime-axis {spec!r}: {name} is not among the rows run (--only)")
    return out


def run_rows(names: tuple[str, ...], unknowns: Unknowns, runs_dir: Path, *, sample_path: Path | None = None,
             log: Callable[[str], None] = print, regimes: str = "live",
             axes: dict[str, dict[str, tuple[Any, ...]]] | None = None) -> list[RowRun]:
    """Run each named row in table order, then (`regimes` "model" or "live") map its regime and (live) confirm it;
    a row that fails is a row saying so, not a crash of the table."""
    if regimes not in REGIME_MODES:
        raise ConfigError(f"regimes must be one of {', '.join(REGIME_MODES)}, got {regimes!r}")
    sample = sample_path or default_sample_path()
    by_name = all_rows()
    runs = []
    for name in names:
        row = by_name[name]
        ctx = RowContext(name, unknowns, runs_dir, log, sample)
        log(f"candidates: {name} ...")
        began = time.monotonic()
        run = run_until_faithful(functools.partial(_run_row, row, ctx), log=log)
        measured = run.measured
        if measured.not_run is None and not run.is_faithful:
            measured = replace(measured, unsettled=f"its run was not faithful ({run.faithful[:200]})")
        run.measured = measured
        if row.regime is not None and regimes != "off" and measured.not_run is None:
            run.regime = _regime(row, ctx, run, unknowns, regimes, (axes or {}).get(name, {}), log)
            if run.regime.unsettled and measured.unsettled is None:
                run.measured = replace(measured, unsettled=run.regime.unsettled)
        run.elapsed_s = time.monotonic() - began
        log(f"candidates: {name} done in {run.elapsed_s:.1f} s")
        runs.append(run)
    return runs


def _regime(row: Row, ctx: RowContext, run: RowRun, u: Unknowns, mode: str, axes: dict[str, tuple[Any, ...]],
            log: Callable[[str], None]) -> RegimeResult:
    regime = row.regime
    for key, values in axes.items():
        regime = regime.with_values(key, values)
    verdict = judge_one(run.measured, u)
    began = time.monotonic()
    result = map_regime(regime, ctx, run, verdict)
    log(f"candidates: {ctx.name}: regime mapped ({len(regime.x.values)} x {len(regime.y.values)} points) in "
        f"{time.monotonic() - began:.1f} s")
    if mode == "live":
        confirm(result, ctx, run, verdict, _confirming(row), u, log)
    else:
        result.where = where_text(result, no_kernel=run.measured.decl.identity, incumbent=run.measured.incumbent)
    return result
