"""`kvtransit verdict REPORT.json [REPORT.json ...]`: the five tests of each run report (docs/reference.md §8).

Each report's KV hand-off is judged by bottleneck, operations, budget, precision and placement
(`model/judge/five_tests.py`), from what that run measured, and printed as a table (test, passed, measured, target,
reason) with the scale and dilation the run was measured at; `--json` prints the same blocks. A report written
before reports carried a `verdict` block has it computed from its own fields; one that lacks a field the
verdict needs is a one-line error naming the file and the field.

    kvtransit up --requests 20 --rate 2 --no-progress --report /tmp/vt/r.json
    kvtransit verdict /tmp/vt/r.json

`--baselines` (baselines at equal power; `harness/studies/sweep/baselines.py`): three reports, the kernel in
transit, the same codec at the GPU and codec none on the next faster link (`kvtransit sweep --preset baselines` runs
them; its reports are in OUT/points/), recognised by their config (codec, compress_at, link) in any order, side by side:
J/request (link + module + GPU [+ pool] joules over the requests that finished), E2E mean/p99, TTFT p99, hand-off p99,
SLO attainment, faithful, and the scale/dilation each was measured at; then the answer (does the kernel beat both?),
which is "not settled" when it rests on a run that was not faithful.

    kvtransit verdict --baselines OUT/points/*.json

`--accuracy-results FILE`: the precision test judges the run's kernel by its measured task-level loss,
the perplexity increase a real model showed over that codec's cache, read from the row of FILE (written by
`kvtransit accuracy --end-to-end --results FILE`) whose setting is the run's (codec, keep, block, sinks, variant,
precision_bits; model/judge/task_accuracy.py: `codec_key`); within tolerance is at most +1 %. A run whose setting has no
row is judged as without the file (tensor error against the equal-bytes baseline), and the reason says so.

    kvtransit verdict --accuracy-results docs/results/accuracy.json /tmp/vt/r.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvtransit.cli._common import CliError, add_json_flag, print_json, print_table


def register(subparsers) -> None:
    p = subparsers.add_parser("verdict", help="the five tests (bottleneck, operations, budget, precision, placement) "
                              "of run reports", description=__doc__)
    p.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json", help="a run report (kvtransit up --report)")
    p.add_argument("--baselines", action="store_true",
                   help="compare three reports (kernel in transit, at the GPU, none on the next faster link) at equal "
                        "power instead of judging each")
    p.add_argument("--accuracy-results", type=Path, default=None, metavar="FILE",
                   help="judge precision by the measured perplexity increase in FILE (kvtransit accuracy --end-to-end "
                        "--results FILE)")
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


def _read_accuracy_results(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}: not an accuracy results file (not JSON: {exc.msg} at line {exc.lineno})") from None


def with_task_loss(verdict: dict[str, Any], report: dict, results: Any, where: str) -> dict[str, Any]:
    """`verdict` with its precision test judged again by the measured task-level loss of the run's codec setting in
    `results` (a parsed results file named `where`); unchanged when no kernel ran on the link."""
    from dataclasses import fields

    from kvtransit.model.errors import ConfigError
    from kvtransit.model.judge.five_tests import FiveTests, Judgement, PrecisionMeasured, precision_test
    from kvtransit.model.judge.task_accuracy import codec_key, task_loss_from_results
    from kvtransit.report.build import MissingReportField, scenario_from_config

    if verdict.get("kernel") is None:
        return verdict
    try:
        scenario = scenario_from_config(report["config"])
        key = codec_key(scenario.codec, keep=scenario.keep, block=scenario.block, sinks=scenario.sinks,
                        variant=scenario.variant, precision_bits=scenario.precision_bits)
        loss = task_loss_from_results(results, key, where=where)
    except (MissingReportField, ConfigError) as exc:
        raise CliError(str(exc)) from None
    note = (f"{where} has no row for {key}: judged by tensor error against the equal-bytes baseline" if loss is None
            else "")
    tests = [Judgement(**t) for t in verdict["tests"]]
    old = next(t for t in tests if t.test == "precision")
    saved: dict[str, Any] = {f.name: old.values.get(f.name) for f in fields(PrecisionMeasured)}
    measured = PrecisionMeasured(**saved)
    judged = precision_test(scenario.codec_declaration, measured, loss, task_note=note)
    five = FiveTests(verdict["flow"], verdict["kernel"], tuple(judged if t.test == "precision" else t for t in tests))
    return {**verdict, **five.as_dict()}


def report_verdict(path: Path, accuracy_results: Path | None = None) -> dict[str, Any]:
    """{report, scale, dilation, **the verdict block} for the report at `path` (its block, or computed from its
    fields when it has none); with `accuracy_results`, precision judged by the measured task-level loss."""
    from kvtransit.model.errors import ConfigError
    from kvtransit.report.build import MissingReportField, handoff_verdict

    report = _read_report(path)
    verdict = report.get("verdict")
    if not isinstance(verdict, dict):
        try:
            verdict = handoff_verdict(report)
        except MissingReportField as exc:
            raise CliError(f"{path}: no 'verdict' block, and it cannot be computed: {exc}") from None
        except ConfigError as exc:
            raise CliError(f"{path}: no 'verdict' block, and its config is not a scenario: {exc}") from None
    if accuracy_results is not None:
        verdict = with_task_loss(verdict, report, _read_accuracy_results(accuracy_results), str(accuracy_results))
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


def baselines_comparison(paths: list[Path]) -> dict[str, Any]:
    """The three reports at `paths` compared at equal power (harness/studies/sweep/baselines.py), each row naming its
    file."""
    from kvtransit.harness.studies.sweep.baselines import compare_at_equal_power, identify_baselines
    from kvtransit.model.errors import ConfigError

    reports = {str(path): _read_report(path) for path in paths}  # every file checked before anything is printed
    try:
        named = identify_baselines(reports)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    files = {name: next(label for label, report in reports.items() if report is named[name]) for name in named}
    comparison = compare_at_equal_power(named)
    for row in comparison["baselines"]:
        row["report"] = files[row["baseline"]]
    return comparison


def _num(value: Any, spec: str, factor: float = 1.0) -> str:
    return "-" if value is None else format(value * factor, spec)


def _baseline_cells(row: dict[str, Any]) -> tuple[str, ...]:
    return (row["baseline"], str(row["link"]), row["codec"], _num(row["j_per_request"], ".3f"),
            f"{_num(row['e2e_mean_s'], '.1f', 1e3)} / {_num(row['e2e_p99_s'], '.1f', 1e3)}",
            _num(row["ttft_p99_s"], ".1f", 1e3), _num(row["handoff_p99_s"], ".1f", 1e3),
            _num(row["slo_attainment"], ".1%"), "yes" if row["faithful"] else "NO",
            f"{_num(row['scale'], '.4g')} / {_num(row['dilation'], 'g')}")


def run_baselines(args) -> int:
    if len(args.reports) != 3:
        raise CliError(f"--baselines takes three reports (kernel in transit, kernel at the GPU, next faster link), "
                       f"got {len(args.reports)}")
    comparison = baselines_comparison(args.reports)
    if args.json:
        print_json(comparison)
        return 0
    rows = comparison["baselines"]
    print_table("baselines at equal power (model terms)",
                ("baseline", "link", "codec", "J/request", "E2E mean/p99 ms", "TTFT p99 ms", "hand-off p99 ms",
                 "SLO att.", "faithful", "scale/dilation"),
                [_baseline_cells(row) for row in rows],
                caption=f"J/request: link + module + GPU (+ pool) J over the requests that finished (ok or outside "
                        f"the SLO: {', '.join(str(r['requests_counted']) for r in rows)}); "
                        f"reports: {', '.join(r['report'] for r in rows)}")
    print(f"is the kernel worth its module at equal power? {comparison['answer']}")
    return 0


def run(args) -> int:
    from kvtransit.report.text import passed_text

    if args.baselines:
        return run_baselines(args)

    # every file checked before anything is printed
    entries = [report_verdict(path, args.accuracy_results) for path in args.reports]
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
