"""`kvtransit up`: one run end to end: decode(s), the middlebox, prefill(s) and the load generator as
separate processes on this host, supervised, with a live progress bar and the run report at the end
(table here; JSON and Markdown files, with figures when matplotlib is installed: the `plots` extra), in
runs/YYYYmmdd-HHMMSS/ unless --report says where. Ctrl-C stops every process and still writes what completed.

Links: `--links auto` (default) runs the middlebox and decode in network namespaces with tc shaping the
middlebox → decode veth when this host can (root, tc/ip, tbf or htb), else everything on loopback with the
middlebox's user-space shaper; `netns` insists (fails loudly), `loopback` never tries. The output and the report
say which back-end shaped each property. `--prometheus` runs a real Prometheus scraping every process.

Before anything starts it says what `--scale` cuts and keeps, how to run at real size, and, when the workload
offers more than the modelled system serves (model/serving/offered_load.py), that its queues will grow all run.

`--frontend` puts the OpenAI-compatible front end (`kvtransit frontend`) in the load generator's place: the run's
requests come from outside clients (the openai client, `vllm bench serve`, ...) at the URL it prints, instead of
the drawn workload (--rate, --requests, ... then do not apply); the run ends after --frontend-requests requests,
after --frontend-duration seconds, or on Ctrl-C, and the report covers every request served.
`--result-format vllm` also writes the summary under `vllm bench serve`'s result keys (REPORT.vllm.json).

Defaults: llama3-8b on 1x h100 per instance, 1 prefill + 1 decode, eth-25g, freq-keep-k keep 0.5 in transit,
100 requests at 2/s (about a minute). Every scenario flag is shared with the agent commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kvtransit.cli._common import SIGNALLED_EXIT, CliError, LiveProgress, add_json_flag, print_json, print_table
from kvtransit.cli.frontend import add_frontend_flags, check_frontend_flags
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args

if TYPE_CHECKING:  # the handler imports the model when it runs
    from datetime import datetime

    from kvtransit.model.scenario import Scenario


def register(subparsers) -> None:
    p = subparsers.add_parser("up", help="run prefill, middlebox, decode and a load generator, and report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scenario_args(p)
    p.add_argument("--report", type=Path, default=None, metavar="PATH",
                   help="report JSON path; the Markdown, the figures (REPORT.figures/) and the run folder "
                        "(REPORT.run/) go beside it (default runs/YYYYmmdd-HHMMSS/report.json)")
    p.add_argument("--accuracy-sample", type=int, default=8, metavar="N",
                   help="requests whose codec error decode measures (default 8)")
    p.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                   help="model seconds to wait for stragglers after the last arrival")
    p.add_argument("--links", choices=("auto", "netns", "loopback"), default="auto",
                   help="network namespaces + tc (netns), loopback + the user-space shaper, or netns when this host "
                        "can (auto, the default)")
    p.add_argument("--prometheus", action="store_true",
                   help="start a real Prometheus (a `prometheus` binary on PATH) scraping every process; its URL is "
                        "printed and put in the report; it stops with the run")
    p.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                   help="where the links manifest and Prometheus's config go (default: REPORT.run/ beside the report)")
    p.add_argument("--restart", default="middlebox", metavar="ROLE[,ROLE]",
                   help="roles whose crashed process is restarted on the same ports mid-run: middlebox, decode, "
                        "or none (default: middlebox; peers reconnect and unacked hand-offs are sent again)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.add_argument("--no-figures", action="store_true",
                   help="write the report without its PNG figures (REPORT.figures/; about 2.6 s and matplotlib)")
    p.add_argument("--frontend", action="store_true",
                   help="serve the OpenAI API (kvtransit frontend) in the load generator's place: outside clients "
                        "send the run's requests")
    add_frontend_flags(p, prefix="frontend-")
    p.add_argument("--result-format", choices=("kvtransit", "vllm"), default="kvtransit",
                   help="vllm: also write the summary under `vllm bench serve`'s result keys, as REPORT.vllm.json")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import asyncio
    import json
    import sys

    from kvtransit.harness.up.agent_commands import FrontendOptions
    from kvtransit.harness.up.launcher import Launcher, RunFailed
    from kvtransit.model.scenario import REAL_MODEL_KV
    from kvtransit.report.text import headline, table_rows
    from kvtransit.runtime.signals import run_until_signalled

    scenario = scenario_from_args(args)
    if args.accuracy_sample < 0:
        raise CliError(f"--accuracy-sample must be >= 0, got {args.accuracy_sample}")
    if scenario.kv_sample == REAL_MODEL_KV:
        from kvtransit.realmodel.extra import require

        require()  # the extra missing: one line naming the packages and the install command, before anything starts
    restart_roles = _restart_roles(args.restart)
    check_frontend_flags(args)
    frontend = (FrontendOptions(listen=args.openai_listen, max_requests=args.max_requests, duration_s=args.duration,
                                tokenizer=args.tokenizer, served_model=args.served_model_name)
                if args.frontend else None)
    total = (args.max_requests or None) if frontend is not None else scenario.requests
    progress_bar = None if args.no_progress or args.json else _ProgressBar(total)

    def log(line: str) -> None:
        # Announcements (links, Prometheus, failures) go to stdout (stderr under --json, which owns stdout),
        # through the progress bar's console when there is one.
        if progress_bar is not None:
            progress_bar.print(line)
        else:
            print(line, flush=True, file=sys.stderr if args.json else sys.stdout)

    for line in run_preamble(scenario, frontend=frontend is not None):  # what is scaled, an overload: said first
        log(f"kvtransit up: {line}")
    report_path = args.report if args.report is not None else default_report_path()
    launcher = Launcher(scenario, report_path=report_path, accuracy_sample=args.accuracy_sample,
                        drain_timeout_s=args.drain_timeout,
                        on_progress=progress_bar.update if progress_bar else None, log=log,
                        links=args.links, prometheus=args.prometheus, run_dir=args.run_dir,
                        restart_roles=restart_roles, frontend=frontend, figures=not args.no_figures)

    async def run_launcher(stop):  # SIGINT/SIGTERM set `stop`: the launcher stops every process, still reports
        return await launcher.run(stop), stop.is_set()

    failure = None
    try:
        if progress_bar:
            progress_bar.start()
        try:
            path, interrupted = asyncio.run(run_until_signalled(run_launcher))
        except RunFailed as exc:
            failure, path, interrupted = str(exc), (report_path if report_path.exists() else None), False
    finally:
        if progress_bar:
            progress_bar.stop()
    if path is None:
        raise CliError(failure or "the run ended without a report")
    report = json.loads(Path(path).read_text())
    if args.result_format == "vllm":
        write_vllm_result(report, Path(path))
    if args.json:
        print_json(report)
    else:
        print_table("kvtransit run (model time, ms)", ("metric", "mean", "p50", "p90", "p99", "max"),
                    table_rows(report))
        for line in headline(report):
            print(line)
        print(f"report: {path} and {Path(path).with_suffix('.md')}"
              + (f" and {vllm_result_path(Path(path))}" if args.result_format == "vllm" else ""))
    if failure:
        sys.stderr.write(f"kvtransit up: error: {failure}\n")
        return 1
    return SIGNALLED_EXIT if interrupted else 0


# Where `kvtransit up` writes without --report: one folder a run under ./runs (ignored by git), so runs neither
# litter the current directory nor overwrite each other.
RUNS_DIR = Path("runs")


def default_report_path(now: datetime | None = None, runs: Path = RUNS_DIR) -> Path:
    """`runs/YYYYmmdd-HHMMSS/report.json` (local time, when the run starts); `-2`, `-3`, … when a run already took
    that second's folder. Nothing is created here: the launcher makes the folder when it writes the run's files."""
    from datetime import datetime

    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    folder, n = runs / stamp, 1
    while folder.exists():
        n += 1
        folder = runs / f"{stamp}-{n}"
    return folder / "report.json"


def vllm_result_path(report_path: Path) -> Path:
    return report_path.with_suffix(".vllm.json")


def write_vllm_result(report: dict, report_path: Path) -> Path:
    """The run summary under `vllm bench serve`'s result keys (agents/frontend/vllm_result.py), beside the report."""
    import json
    from datetime import datetime

    from kvtransit.agents.frontend.vllm_result import vllm_result

    path = vllm_result_path(report_path)
    # vLLM's own `date` format (vllm/benchmarks/serve.py: current_dt); the local time the summary was written.
    result = vllm_result(report, date=datetime.now().strftime("%Y%m%d-%H%M%S"))
    path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    return path


def run_preamble(scenario: Scenario, *, frontend: bool = False) -> list[str]:
    """The lines `kvtransit up` prints before it starts: what the scale cuts and keeps (the report's own words),
    how to run at real size, and a warning when the workload offers more than the modelled system serves
    (parsing a trace here also refuses a bad one before any process or namespace exists). With the front end
    the workload is whoever calls it: no drawn workload to judge."""
    from kvtransit.model.serving.offered_load import offered_vs_capacity
    from kvtransit.report.text import scale_note
    from kvtransit.workload.source import requests_for

    config = scenario.describe()
    lines = [line for line in (scale_note(config),) if line]
    if config["effective_scale"] < 1:
        lines.append(f"real size: --scale 1 --dilation {config['real_size_dilation']:g} (the {scenario.link} link "
                     f"then runs at {config['host_budget_Bps'] / 1e6:g} MB/s, what this host keeps up with)")
    if frontend:
        lines.append("the requests come from the OpenAI front end's clients: the drawn workload's flags (--rate, "
                     "--requests, ...) do not apply")
    elif warning := offered_vs_capacity(scenario, requests_for(scenario)).warning():
        lines.append(f"WARNING: {warning}")
    return lines


def _restart_roles(text: str) -> tuple[str, ...]:
    from kvtransit.harness.up.supervisor import RESTARTABLE_ROLES

    roles = tuple(r.strip() for r in text.split(",") if r.strip() and r.strip() != "none")
    for role in roles:
        if role not in RESTARTABLE_ROLES:
            raise CliError(f"--restart: unknown role {role!r} (choose from: {', '.join(RESTARTABLE_ROLES)}, none)")
    return roles


class _ProgressBar(LiveProgress):
    """requests done, in flight, TTFT/TPOT p99 so far, link rate (model terms)."""

    def __init__(self, total: int | None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        super().__init__(Progress(TextColumn("[bold]requests"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), transient=True))
        self._task = self._progress.add_task("run", total=total, detail="starting…")

    def update(self, snapshot: dict) -> None:
        def ms(value):
            return "-" if value is None else f"{value * 1e3:.1f} ms"

        rate = snapshot.get("link_Bps")
        detail = (f"in flight {snapshot['in_flight']}  TTFT p99 {ms(snapshot.get('ttft_p99_s'))}  "
                  f"TPOT p99 {ms(snapshot.get('tpot_p99_s'))}  "
                  f"link {'-' if rate is None else f'{rate / 1e9:.2f} GB/s'}")
        self._progress.update(self._task, completed=snapshot["done"], detail=detail)
