"""`kvtransit plot RESULTS`: the sweep's plots and Markdown tables from a results file (or its directory).

Writes, beside the results: slo_attainment.png (SLO attainment vs load per codec), handoff_p99.png (hand-off
p99 vs load, log y), link_busy.png (link busy vs load), tpot_p99.png (TPOT p99 vs load with the SLO line),
and results.md. Needs matplotlib (`pip install 'kvtransit[plots]'`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtransit.cli._common import CliError


def register(subparsers) -> None:
    p = subparsers.add_parser("plot", help="plots and tables from a sweep's results file", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, metavar="RESULTS", help="results.json, or the sweep's directory")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="where the PNGs go (default: beside RESULTS)")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.harness.studies.sweep.report import write_plots, write_tables
    from kvtransit.harness.studies.sweep.runner import RESULTS_JSON, ResultsStore

    if not args.results.exists():
        raise CliError(f"{args.results}: no such file or directory")
    directory = args.results if args.results.is_dir() else args.results.parent
    if args.results.is_file() and args.results.name != RESULTS_JSON:
        raise CliError(f"{args.results}: expected a sweep's {RESULTS_JSON} (or its directory)")
    store = ResultsStore(directory)
    if not store.rows:
        raise CliError(f"{store.json_path}: no results (run `kvtransit sweep --out {directory}` first)")
    try:
        plots = write_plots(list(store.rows.values()), args.out or directory)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    tables = write_tables(list(store.rows.values()), directory / "results.md")
    print(f"plots: {', '.join(str(p) for p in plots)}\ntables: {tables}")
    return 0
