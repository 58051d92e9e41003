"""`kvtransit chaos [SCENARIO ...]`: run named faults against a live testbed and judge each by the request ledger.

Each scenario is one short serving run (real processes; a middlebox or decode that dies is restarted on the same
ports) with one fault a couple of seconds in: middlebox-kill, decode-restart, decode-kill, link-down, rate-collapse,
corrupt, reset-peer, loss, latency, slicer, slow-decode, malformed-peer, control-abuse (`--list` describes them).
With no scenario named, all of them run. The table: requests, ok, slo-miss, failed (by reason), lost, duplicated,
cross-delivered, and the recovery time (end of the fault → the first hand-off that reached decode after it).
Exit status 1 when any scenario lost, duplicated, cross-delivered or corrupted a request, failed one without a
reason, or failed a check of its own.

On a cluster: `--render k8s --out DIR` writes a testbed for the chaos scenario (DIR/testbed/, a kustomize base)
and one experiment per scenario with the same names (DIR/experiments/NAME.yaml: Chaos Mesh NetworkChaos or
PodChaos, or a Job for the middlebox's own faults; INDEX.md says which). `--check-ledger LEDGER` judges a run by
its ledger file as a local scenario is judged (a cluster run's: the load generator's REPORT.run/ledger.jsonl).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from kvtransit.cli._common import CliError, add_json_flag, print_json, print_table
from kvtransit.cli.k8s import add_placement_flags, cluster_options

JSON_KEYS = ("scenario", "requests", "ok", "slo_miss", "failed", "lost", "duplicated", "cross_delivered", "recovery_s")


def register(subparsers) -> None:
    p = subparsers.add_parser("chaos", help="inject faults into a live testbed; check nothing was lost",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="scenarios to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--requests", type=int, default=None, metavar="N", help="requests per scenario (default 30)")
    p.add_argument("--rate", type=float, default=None, metavar="RPS", help="arrival rate (default 4/s)")
    p.add_argument("--links", choices=("loopback", "netns", "auto"), default="loopback",
                   help="loopback (default) or network namespaces with tc (link-down then takes the veth down)")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="testbeds at once, each scenario on its own (default 1: one after another). Each testbed "
                        "takes about 0.6 of a core: on a 2-core box 3 at once fits")
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="where each scenario's report and ledger go (default: a temporary directory, removed)")
    p.add_argument("--render", choices=("k8s",), default=None,
                   help="write the scenarios as cluster experiments into --out instead of running them")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="with --render: where the manifests go")
    p.add_argument("--check-ledger", type=Path, default=None, metavar="LEDGER",
                   help="judge one run's ledger file (JSONL) as a chaos scenario is judged, and exit")
    add_placement_flags(p, what="the chaos testbed")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import asyncio
    import sys

    from kvtransit.harness.studies import chaos
    from kvtransit.harness.up.launcher import RunFailed

    if args.list:
        print_table("chaos scenarios", ("scenario", "fault"),
                    [(p.name, p.description) for p in chaos.SCENARIOS.values()])
        return 0
    if args.check_ledger is not None:
        return check_ledger(args.check_ledger, as_json=args.json)
    if args.render:
        return render(args)
    plans = chaos.select(args.scenarios)
    overrides = {k: v for k, v in (("requests", args.requests), ("rate", args.rate)) if v is not None}
    if overrides.get("requests", 1) < 1 or overrides.get("rate", 1.0) <= 0:
        raise CliError("--requests must be >= 1 and --rate > 0")
    scenario = chaos.chaos_scenario(**overrides)
    needed_s = chaos.FAULT_AT_S + chaos.FAULT_FOR_S + 2.0  # the load must outlast the longest fault
    if scenario.requests / scenario.rate < needed_s:
        raise CliError(f"--requests {scenario.requests} at --rate {scenario.rate:g}/s is "
                       f"{scenario.requests / scenario.rate:.1f} s of load; the faults need {needed_s:.0f} s "
                       f"(use --requests >= {int(needed_s * scenario.rate + 0.999)})")
    if args.parallel < 1:
        raise CliError(f"--parallel must be >= 1, got {args.parallel}")
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else (lambda line: None)
    if not args.json:
        for plan in plans:
            print(f"chaos: {plan.name}: {plan.description}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvtransit-chaos-") as scratch:
        by_name = asyncio.run(chaos.run_scenarios(plans, args.workdir or Path(scratch), scenario,
                                                  parallel=args.parallel, links=args.links, log=log))
    for name, result in by_name.items():
        if isinstance(result, RunFailed):
            raise CliError(f"chaos scenario {name}: {result}") from None
        if isinstance(result, BaseException):
            raise result
    results = [r for r in by_name.values() if isinstance(r, chaos.ChaosResult)]
    rows = [r.as_json() for r in results]
    if args.json:
        print_json([{**{k: row[k] for k in JSON_KEYS}, **{k: v for k, v in row.items() if k not in JSON_KEYS}}
                    for row in rows])
    else:
        print_table("kvtransit chaos", ("fault", "requests", "ok", "slo-miss", "failed (by reason)", "lost",
                                        "duplicated", "cross-delivered", "recovery", "verdict"),
                    [(row["scenario"], row["requests"], row["ok"], row["slo_miss"], _failed(row["failed"]),
                      row["lost"], row["duplicated"], row["cross_delivered"], _seconds(row["recovery_s"]),
                      "pass" if row["passed"] else "FAIL: " + "; ".join(row["problems"])) for row in rows])
    return 0 if all(r.passed for r in results) else 1


def _failed(by_reason: dict) -> str:
    if not by_reason:
        return "0"
    return ", ".join(f"{n} {reason}" for reason, n in sorted(by_reason.items(), key=lambda kv: -kv[1]))


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.2f} s"


def render(args) -> int:
    from kvtransit.harness.deploy.k8s.chaos_mesh import CLUSTER_REQUESTS
    from kvtransit.harness.deploy.k8s.render import write_chaos
    from kvtransit.harness.studies import chaos

    if args.out is None:
        raise CliError("--render k8s needs --out DIR")
    if args.scenarios:
        raise CliError("--render k8s writes every scenario (each a file of its own name); name none")
    overrides = {"requests": CLUSTER_REQUESTS if args.requests is None else args.requests}
    if args.rate is not None:
        overrides["rate"] = args.rate
    scenario = chaos.chaos_scenario(**overrides)
    written = write_chaos(args.out, scenario, cluster_options(args, link_shaper="userspace"), force=args.force)
    print(f"kvtransit chaos: {len(chaos.SCENARIOS)} experiments and their testbed, {len(written)} files in "
          f"{args.out} (see {args.out / 'experiments' / 'INDEX.md'})")
    return 0


def check_ledger(path: Path, *, as_json: bool) -> int:
    """The ledger checks of a chaos scenario (model.ledger_check) on one run's ledger file."""
    from kvtransit.harness.studies.chaos import peer_counts
    from kvtransit.model.judge import ledger_check

    try:
        with open(path, encoding="utf-8") as handle:
            records = ledger_check.parse(handle, str(path))
    except OSError as exc:
        raise CliError(f"--check-ledger {path}: {exc.strerror or exc}") from None
    verdict = ledger_check.check(records)
    summary = {**verdict.summary(), **peer_counts(records), "passed": verdict.ok, "problems": verdict.problems()}
    if as_json:
        print_json({"ledger": str(path), **summary})
    else:
        print_table(f"ledger {path}", ("requests", "ok", "slo-miss", "failed (by reason)", "lost", "duplicated",
                                       "cross-delivered", "corrupted", "verdict"),
                    [(summary["requests"], summary["ok"], summary["slo_miss"], _failed(summary["failed"]),
                      summary["lost"], summary["duplicated"], summary["cross_delivered"], summary["corrupted"],
                      "pass" if verdict.ok else "FAIL: " + "; ".join(summary["problems"]))])
    return 0 if verdict.ok else 1
