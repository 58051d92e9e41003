"""`kvtransit sweep`: a grid of live runs (links × codecs × where the codec runs × request rates, or any
other scenario field), one row per point in OUT/results.json and OUT/results.csv, the Markdown tables in
OUT/results.md (rows = load, columns = codecs, one table per link × metric) and the plots as OUT/*.png.

    kvtransit sweep --out runs/s1 --grid rate=8,10 --grid codec=none,freq-keep-k --requests 40
    kvtransit sweep --out runs/deck --preset handoff-25g
    kvtransit sweep --out runs/gp --goodput-search --grid codec=none,fp8 --rate-lo 4 --rate-hi 16
    kvtransit sweep --out runs/t1 --twin --grid rate=4,6,8,10,12,14,16 --grid codec=none,fp8 --verify 4

Every point is a real run of the testbed (the same Launcher as `kvtransit up`), placed as `up` places it:
`--links auto` (default) runs the middlebox and decode in network namespaces with tc shaping the link when
this host can (root, tc/ip), else on loopback with the user-space shaper, which reaches only part of a fast
link's rate (its points then report unfaithful); the table's `placement` column says where each point ran.

On a cluster: `--render k8s --out DIR` writes the points as one Indexed Job (one point per pod, each pod on a node of
its own, the whole testbed inside it); each pod prints its row on its log, and `--collect LOGS_DIR --out RESULTS`
gathers the pods' logs into RESULTS/results.json and .csv, byte for byte what a local sweep of those rows writes
(deploy/k8s/README.md). `--run-point` is what each pod runs.

    kvtransit sweep --render k8s --out deploy/sweep1 --grid rate=4,8,12 --nodes 3
    kvtransit sweep --collect logs/ --out runs/sweep1

On the twin: `--twin` runs every point on the twin instead (`kvtransit twin`: the model on a virtual clock, seconds a
grid), its rows in OUT/twin/ (results.json, .csv, .md, plots), apart from the live rows; `--verify N` then runs N of
them live into OUT/ (the frontier, where SLO attainment crosses --target between neighbouring loads, then the points
nearest it: harness/studies/sweep/verify.py) and writes OUT/twin-vs-live.md, the two side by side, largest
disagreement first.

Resumable: a point already in OUT/results.json with the same scenario is not run again unless --rerun (a row
keeps the placement it ran on). With --preset, the preset fixes the scenario; a scenario flag given with a value
other than its default overrides the preset's (e.g. --requests 80 for a short pass). `--goodput-search`: per
link × codec of the grid, DistServe's goodput (the highest rate whose SLO attainment reaches --target) by
bisection between --rate-lo and --rate-hi, --iterations midpoints at most; each run is a row of the same
results file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtransit.cli._common import SIGNALLED_EXIT, CliError, LiveProgress, add_json_flag, print_json, print_table
from kvtransit.cli.k8s import add_placement_flags, node_selector
from kvtransit.cli.scenario_flags import add_scenario_args, kernel_file_fields, scenario_from_args


def register(subparsers) -> None:
    from kvtransit.harness.studies.sweep.plan import DEFAULT_GOODPUT_TARGET, presets

    p = subparsers.add_parser("sweep", help="run a grid of live runs (links x codecs x rates ...) and tabulate",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="results directory (resumed if it exists)")
    p.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2,...",
                   help="an axis: a scenario field and its values (repeat; the last varies fastest)")
    p.add_argument("--preset", choices=tuple(presets()), default=None,
                   help="; ".join(f"{name}: {text}" for name, (text, _) in presets().items()))
    p.add_argument("--rerun", action="store_true", help="run points already in the results file again")
    p.add_argument("--links", choices=("auto", "netns", "loopback"), default="auto",
                   help="network namespaces + tc (netns), loopback + the user-space shaper, or netns when this host "
                        "can (auto, the default), for every point (as `kvtransit up --links`)")
    p.add_argument("--accuracy-sample", type=int, default=2, metavar="N", help="requests whose codec error decode "
                   "measures, per point (default 2)")
    p.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                   help="model seconds to wait for stragglers after the last arrival, per point")
    p.add_argument("--no-plots", action="store_true", help="results and tables only (no matplotlib needed)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.add_argument("--verbose", action="store_true", help="show each run's launcher lines (links, failures)")
    t = p.add_argument_group("on the twin")
    t.add_argument("--twin", action="store_true",
                   help="run the points on the twin (the model on a virtual clock, seconds a grid) into OUT/twin/")
    t.add_argument("--verify", type=int, default=0, metavar="N",
                   help="with --twin: then run N of its points live (the SLO frontier first) and compare")
    g = p.add_argument_group("goodput search")
    g.add_argument("--goodput-search", action="store_true", help="bisect for the goodput per link x codec")
    g.add_argument("--rate-lo", type=float, default=1.0, metavar="RPS", help="low end of the bracket (default 1)")
    g.add_argument("--rate-hi", type=float, default=16.0, metavar="RPS", help="high end of the bracket (default 16)")
    g.add_argument("--target", type=float, default=DEFAULT_GOODPUT_TARGET, metavar="ATTAINMENT",
                   help=f"SLO attainment the goodput must reach (default {DEFAULT_GOODPUT_TARGET})")
    g.add_argument("--iterations", type=int, default=4, metavar="N", help="most bisection midpoints (default 4)")
    k = p.add_argument_group("on a cluster")
    k.add_argument("--render", choices=("k8s",), default=None,
                   help="write the grid as a Kubernetes Indexed Job into --out instead of running it")
    k.add_argument("--collect", type=Path, default=None, metavar="LOGS_DIR",
                   help="gather the pod logs in LOGS_DIR into --out's results file (and tables, plots)")
    k.add_argument("--run-point", type=Path, default=None, metavar="POINTS_JSON",
                   help="(what each pod of the Job runs) run the point of $JOB_COMPLETION_INDEX and print its row")
    add_placement_flags(p, what="the sweep's points")
    add_scenario_args(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def _explicit_overrides(args) -> dict:
    """Scenario flags whose value differs from the field's default (what a user asked for over a preset)."""
    from kvtransit.model.scenario import scenario_fields

    given = scenario_from_args(args).as_dict()
    defaults = {f.name: f.default for f in scenario_fields()}
    return {k: v for k, v in given.items() if defaults.get(k) != v}


def _grids(args):
    from kvtransit.harness.studies.sweep.plan import Grid, parse_axis, preset

    axes = dict(parse_axis(spec) for spec in args.grid)
    kernel_path = getattr(args, "kernel_declaration_file", None)
    if kernel_path:  # a grid axis over a field the kernel file sets would silently run another kernel
        clash = sorted(set(kernel_file_fields(kernel_path, {})) & set(axes))
        if clash:
            raise CliError(f"--grid {clash[0]}=... varies a field --kernel {kernel_path} sets ({', '.join(clash)}): "
                           f"drop one")
    if args.preset:
        overrides = _explicit_overrides(args)
        grids = [Grid({**grid.base, **overrides}, {**grid.axes, **axes}) for grid in preset(args.preset)]
    else:
        grids = [Grid(scenario_from_args(args).as_dict(), axes)]
    return grids


def run(args) -> int:
    import sys

    from kvtransit.harness.studies.sweep.report import write_plots, write_tables
    from kvtransit.harness.studies.sweep.runner import (
        PointRunner,
        ResultsStore,
        SweepInterrupted,
        TwinPointRunner,
        run_sweep,
        search_goodput,
        sweep_points,
    )

    if args.accuracy_sample < 0:
        raise CliError(f"--accuracy-sample must be >= 0, got {args.accuracy_sample}")
    if args.run_point is not None:
        return run_point(args)
    if args.collect is not None:
        return collect(args)
    if args.render:
        return render(args)
    if args.verify < 0:
        raise CliError(f"--verify must be >= 0, got {args.verify}")
    if args.verify and not args.twin:
        raise CliError("--verify N runs N of a twin grid's points live: give --twin")
    if args.verify and args.goodput_search:
        raise CliError("--verify chooses among a grid's points; a --goodput-search on the twin has no grid to choose "
                       "from: give --grid rate=... instead")
    if args.twin and args.render:
        raise CliError("--twin runs here in seconds; --render k8s is for live points")
    grids = _grids(args)
    twin_store = ResultsStore(args.out / "twin") if args.twin else None
    store = twin_store or ResultsStore(args.out)

    def log(line: str) -> None:
        if args.verbose:
            (bar.print if bar else lambda text: print(text, file=sys.stderr))(line)

    bar = None if args.no_progress or args.json else _SweepProgress()
    live_runner = PointRunner(args.out, links=args.links, accuracy_sample=args.accuracy_sample,
                              drain_timeout_s=args.drain_timeout, log=log, on_progress=bar.requests if bar else None)
    runner = TwinPointRunner(store.directory) if args.twin else live_runner
    searches = []
    # Every point built (and checked) before anything runs or draws.
    bases = _goodput_bases(grids) if args.goodput_search else []
    points = [] if args.goodput_search else sweep_points(grids)
    try:
        if bar:
            bar.start()
        if args.goodput_search:
            for base in bases:
                if bar:
                    bar.begin_search(f"{base.link} {base.codec}@{base.compress_at}", args.iterations + 2)
                search = search_goodput(base, store, runner, lo=args.rate_lo, hi=args.rate_hi, target=args.target,
                                        iterations=args.iterations, rerun=args.rerun,
                                        on_start=bar.point if bar else None)
                searches.append((base, search))
        else:
            if bar:
                bar.begin_grid(len(points))
            run_sweep(points, store, runner, rerun=args.rerun, on_start=bar.point if bar else None,
                      on_done=bar.done if bar else None)
        if args.verify:
            verified = _verify(args, points, store, live_runner, bar)
    except SweepInterrupted as exc:
        write_tables(list(store.rows.values()), store.directory / "results.md")
        print(f"kvtransit sweep: {exc}; {len(store.rows)} point(s) recorded in {store.json_path} (the same command "
              "resumes from there)", file=sys.stderr)
        return SIGNALLED_EXIT
    finally:
        if bar:
            bar.stop()
    rows = list(store.rows.values())
    tables = write_tables(rows, store.directory / "results.md")
    plots = [] if args.no_plots else write_plots(rows, store.directory)
    if args.verify:
        return _print_verified(args, verified, rows)
    if args.json:
        print_json({"results": str(store.json_path), "rows": rows, "goodput": [
            {"link": b.link, "codec": b.codec, "compress_at": b.compress_at, "goodput_rps": s.goodput_rps,
             "bracket": [s.good, s.bad], "evaluations": s.evaluations, "faithful": s.faithful,
             "unfaithful_rates": s.unfaithful} for b, s in searches]})
        return 0
    if searches:
        print_table(f"goodput (attainment >= {args.target:g})", ("link", "codec", "goodput req/s", "bracket", "runs"),
                    [(b.link, f"{b.codec}@{b.compress_at}", s.answer(), s.bracket(), str(len(s.evaluations)))
                     for b, s in searches])
        if not all(s.faithful for _, s in searches):
            print("*: the answer rests on runs that were not faithful (their reports' `fidelity` says which check "
                  "and the --scale or --dilation that would fix it)")
    else:
        print_table("sweep", ("point", "status", "SLO att.", "TTFT p99 ms", "TPOT p99 ms", "hand-off p99 ms",
                              "KV wait share", "link busy", "faithful", "placement", "wall s"),
                    [_summary_row(r) for r in rows])
    print(f"results: {store.json_path}, {store.csv_path}, {tables}" + (f"; plots: {', '.join(p.name for p in plots)}"
                                                                      if plots else ""))
    print(f"points run now: {runner.runs}; already in the results file: {len(rows) - runner.runs}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


def _verify(args, points, twin_store, live_runner, bar):
    """The twin grid's chosen points run live into OUT/ (harness/studies/sweep/verify.py); the comparison entries."""
    from kvtransit.harness.studies.sweep.runner import ResultsStore, run_sweep
    from kvtransit.harness.studies.sweep.verify import choose_points, comparison, comparison_markdown

    keys = choose_points([twin_store.rows[k] for k, _ in points if k in twin_store.rows], args.verify, args.target)
    live_store = ResultsStore(args.out)
    chosen = [(k, s) for k, s in points if k in keys]
    if bar:
        bar.begin_grid(len(chosen))
    run_sweep(chosen, live_store, live_runner, rerun=args.rerun, on_start=bar.point if bar else None,
              on_done=bar.done if bar else None)
    entries = comparison(twin_store.rows, live_store.rows, keys)
    (args.out / "twin-vs-live.md").write_text(comparison_markdown(entries))
    return entries


def _print_verified(args, entries, twin_rows) -> int:
    from kvtransit.harness.studies.sweep.verify import COMPARED

    if args.json:
        print_json({"twin_results": str(args.out / "twin" / "results.json"), "twin_rows": twin_rows,
                    "verified": entries})
    else:
        print_table("the twin against live runs (twin / live, model terms)",
                    ("point", *(h for _, h, _ in COMPARED), "live faithful", "departs most in"),
                    [(e["key"], *(f"{_fmt(e['twin'].get(k), f)} / {_fmt(e['live'].get(k), f)}" for k, _, f in COMPARED),
                      "yes" if e["live"].get("faithful") else "NO", e["departure"]) for e in entries])
        print(f"twin grid: {args.out / 'twin' / 'results.md'} ({len(twin_rows)} points); verified live: "
              f"{args.out / 'twin-vs-live.md'}")
    return 1 if any(e["live"].get("status") != "ok" for e in entries) else 0


def _fmt(value, fmt) -> str:
    return "-" if value is None else fmt(value)


def _goodput_bases(grids):
    """One base scenario per distinct link × codec × compress_at of the grids (the rate axis is the search's)."""
    from kvtransit.harness.studies.sweep.runner import sweep_points

    bases, seen = [], set()
    for _, scenario in sweep_points(grids):
        ident = (scenario.link, scenario.codec, scenario.compress_at)
        if ident not in seen:
            seen.add(ident)
            bases.append(scenario)
    return bases


def _summary_row(row: dict) -> tuple:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    return (row["key"], row["status"] if row["status"] == "ok" else f"failed: {row['error'][:60]}",
            fmt(row["slo_attainment"], ".1%"), fmt(row["ttft_p99_ms"], ".1f"), fmt(row["tpot_p99_ms"], ".2f"),
            fmt(row["handoff_p99_ms"], ".1f"), fmt(row.get("kv_wait_share"), ".1%"), fmt(row["link_busy"], ".1%"),
            ("twin" if row.get("source") == "twin" else
             "-" if row["faithful"] is None else ("yes" if row["faithful"] else "NO")), row.get("placement") or "-",
            fmt(row["wall_s"], ".1f"))


class _SweepProgress(LiveProgress):
    """Two bars: points of the grid (the current point's key), and requests of the running point."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        super().__init__(Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn()))
        self._points = self._progress.add_task("points", total=1, detail="")
        self._requests = self._progress.add_task("requests", total=1, detail="", visible=False)

    def begin_grid(self, total: int) -> None:
        self._progress.update(self._points, total=total, completed=0, description="points")

    def begin_search(self, label: str, most_runs: int) -> None:
        self._progress.update(self._points, total=most_runs, completed=0, description=f"goodput {label}")

    def point(self, index: int, key: str, scenario, skipped: bool) -> None:
        self._progress.update(self._points, completed=index, detail=key + (" (in results, skipped)" if skipped else ""))
        self._progress.update(self._requests, total=scenario.requests, completed=0, visible=not skipped,
                              detail="starting…")

    def done(self, index: int, row: dict) -> None:
        self._progress.update(self._points, completed=index + 1)
        # The last progress poll may predate the run's end: show the point as over.
        self._progress.update(self._requests, completed=row.get("requests") or 0, detail=row["status"])

    def requests(self, snapshot: dict) -> None:
        def ms(value):
            return "-" if value is None else f"{value * 1e3:.1f} ms"

        self._progress.update(self._requests, completed=snapshot["done"],
                              detail=f"TTFT p99 {ms(snapshot.get('ttft_p99_s'))}  "
                                     f"TPOT p99 {ms(snapshot.get('tpot_p99_s'))}")


def render(args) -> int:
    from kvtransit.harness.deploy.k8s.render import write_sweep
    from kvtransit.harness.deploy.k8s.sweep_job import SweepJobOptions
    from kvtransit.harness.studies.sweep.runner import sweep_points

    if args.goodput_search:
        raise CliError("--render k8s: a goodput search picks each rate from the last run's answer, so its points "
                       "cannot fan out at once; render a --grid rate=... instead")
    points = sweep_points(_grids(args))
    options = SweepJobOptions(name=args.k8s_name, image=args.image, nodes=args.nodes,
                              preferred_affinity=args.preferred_affinity,
                              node_selector=node_selector(args.node_selector), links=args.links,
                              accuracy_sample=args.accuracy_sample, drain_timeout_s=args.drain_timeout)
    written = write_sweep(args.out, points, options, args.namespace, force=args.force)
    print(f"kvtransit sweep: {len(points)} points as an Indexed Job, {len(written)} files in {args.out}")
    print(f"  kubectl apply -k {args.out}; then, when it is done, each pod's log into one directory and "
          f"kvtransit sweep --collect LOGS_DIR --out RESULTS")
    return 0


def run_point(args) -> int:
    import sys

    from kvtransit.harness.deploy.k8s.sweep_job import points_from_document, sweep_id
    from kvtransit.harness.deploy.k8s.sweep_logs import completion_index
    from kvtransit.harness.deploy.k8s.sweep_logs import run_point as run_one
    from kvtransit.harness.studies.sweep.runner import PointRunner, SweepInterrupted

    try:
        text = args.run_point.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"--run-point {args.run_point}: {exc.strerror or exc}") from None
    points = points_from_document(text, str(args.run_point))
    runner = PointRunner(args.out, links=args.links, accuracy_sample=args.accuracy_sample,
                         drain_timeout_s=args.drain_timeout)
    try:
        run_one(points, completion_index(), args.out, sweep_id(text), runner, sys.stdout)
    except SweepInterrupted as exc:  # a pod told to stop: its point is not a result (the Job reruns it)
        print(f"kvtransit sweep --run-point: {exc}", file=sys.stderr)
        return SIGNALLED_EXIT
    return 0


def collect(args) -> int:
    from kvtransit.harness.deploy.k8s.sweep_logs import collect as gather
    from kvtransit.harness.studies.sweep.report import write_plots, write_tables

    collected = gather(args.collect, args.out)
    assert collected.store is not None
    rows = list(collected.store.rows.values())
    tables = write_tables(rows, collected.store.directory / "results.md")
    plots = [] if args.no_plots else write_plots(rows, collected.store.directory)
    if args.json:
        print_json({"results": str(collected.store.json_path), "rows": rows, "missing_indexes": collected.missing})
    else:
        print_table("sweep (collected)", ("point", "status", "SLO att.", "TTFT p99 ms", "TPOT p99 ms",
                                          "hand-off p99 ms", "KV wait share", "link busy", "faithful", "placement",
                                          "wall s"), [_summary_row(r) for r in collected.rows])
        print(f"results: {collected.store.json_path}, {collected.store.csv_path}, {tables}"
              + (f"; plots: {', '.join(p.name for p in plots)}" if plots else ""))
    if collected.missing:
        print(f"missing: no log had point(s) {', '.join(map(str, collected.missing))} of {collected.of}")
    return 1 if collected.missing or any(r["status"] != "ok" for r in collected.rows) else 0
