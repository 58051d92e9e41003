"""`kvtransit verdict REPORT.json [REPORT.json ...]`: the five tests of each run report (REFERENCE §8).

Each report's KV hand-off is judged by bottleneck, operations, budget, precision and placement
(`model/five_tests.py`), from what that run measured, and printed as a table (test, passed, measured, target,
reason) with the scale and dilation the run was measured at; `--json` prints the same blocks. A report written
before reports carried a `verdict` block has it computed from its own fields; one that lacks a field the
verdict needs is a one-line error naming the file and the field.

    kvtransit up --requests 20 --rate 2 --no-progress --report /tmp/vt/r.json
    kvtransit verdict /tmp/vt/r.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._common import CliError, add_json_flag, print_json, print_table


def register(subparsers) -> None:
    p = subparsers.add_parser("verdict", help="the five tests (bottleneck, operations, budget, precision, placement) "
                              "of run reports", description=__doc__)
    p.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json", help="a run report (kvtransit up --report)")
    add_json_flag(p)
    p.set_defaults(func=run)


def _read_report(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read it ({exc})") from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}: not a run report (not JSON: {exc.msg} at line {exc.lineno})") from None
    if not isinstance(report, dict) or not isinstance(report.get("config"), dict):
        raise CliError(f"{path}: not a run report (no 'config' block)")
    return report


def report_verdict(path: Path) -> dict[str, Any]:
    """{report, scale, dilation, **the verdict block} for the report at `path` (its block, or computed from its
    fields when it has none)."""
    from kvtransit.agents.loadgen.report import MissingReportField, handoff_verdict
    from kvtransit.model.errors import ConfigError

    report = _read_report(path)
    verdict = report.get("verdict")
    if not isinstance(verdict, dict):
        try:
            verdict = handoff_verdict(report)
        except MissingReportField as exc:
            raise CliError(f"{path}: no 'verdict' block, and it cannot be computed: {exc}") from None
        except ConfigError as exc:
            raise CliError(f"{path}: no 'verdict' block, and its config is not a scenario: {exc}") from None
    config = report["config"]
    at = verdict.get("measured_at") or {}
    return {"report": str(path),
            "scale": at.get("scale", config.get("effective_scale")),
            "dilation": at.get("dilation", config.get("effective_dilation")),
            **verdict}


def _scale_text(entry: dict[str, Any]) -> str:
    scale, dilation = entry["scale"], entry["dilation"]
    return (f"scale {'unknown' if scale is None else f'{scale:.4g}'}, "
            f"dilation {'unknown' if dilation is None else f'{dilation:g}'}")


def run(args) -> int:
    from kvtransit.agents.loadgen.report import passed_text

    entries = [report_verdict(path) for path in args.reports]  # every file checked before anything is printed
    if args.json:
        print_json(entries)
        return 0
    for entry in entries:
        print_table(f"{entry['report']}: {entry['flow']}, {entry['kernel'] or 'no kernel'}, measured at "
                    f"{_scale_text(entry)}",
                    ("test", "passed", "measured", "target", "reason"),
                    [(t["test"], passed_text(t), t["measured"], t["target"], t["reason"]) for t in entry["tests"]],
                    caption=f"verdict: {entry['verdict']}")
    return 0
