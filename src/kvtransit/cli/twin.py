"""`kvtransit twin`: a scenario on the twin, the model on a virtual clock, in seconds of wall time (twin/).

Takes every scenario flag `kvtransit up` takes and runs the same requests (the same seed) through the decisions the
agents make, without processes or sockets: 800 requests of the deck's workload in about a second. Prints the run
report's table and headline, every figure marked as the twin's; `--report PATH` writes the JSON and Markdown (and
its figures, with the `plots` extra) as `kvtransit up` does. A scenario with a flow the twin has no model for is
refused, naming the flow. `kvtransit up` runs the twin of its scenario too and joins it to the live report,
request by request (the report's `twin` block).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtransit.cli._common import add_json_flag, print_json, print_table
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args


def register(subparsers) -> None:
    p = subparsers.add_parser("twin", help="run a scenario on the twin: the model on a virtual clock, in seconds",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(p)
    p.add_argument("--report", type=Path, default=None, metavar="PATH",
                   help="also write the twin's report JSON here, its Markdown (and figures) beside it")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    from kvtransit.report.build import write_report
    from kvtransit.report.text import headline, table_rows
    from kvtransit.twin.report import twin_report
    from kvtransit.twin.serving import run_twin

    scenario = scenario_from_args(args)
    started = time.perf_counter()
    twin = run_twin(scenario)
    report = twin_report(twin, wall_s=time.perf_counter() - started)
    if args.report is not None:
        write_report(report, args.report)
    if args.json:
        print_json(report)
        return 0
    print_table("kvtransit twin (model time, ms; the model's figures, none measured)",
                ("metric", "mean", "p50", "p90", "p99", "max"), table_rows(report))
    for line in headline(report):
        print(line)
    if args.report is not None:
        print(f"report: {args.report} (and {args.report.with_suffix('.md').name})")
    return 0
