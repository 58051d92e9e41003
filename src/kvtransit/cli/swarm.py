"""`kvtransit swarm run`: the compose testbed as a Docker Swarm stack (docker-stack.yml), one run end to end.

    docker swarm init --advertise-addr ADDRESS              # once, on the manager you run this from
    docker node update --label-add kvtransit.prefill=true --label-add kvtransit.middlebox=true \\
        --label-add kvtransit.decode=true --label-add kvtransit.loadgen=true NODE     # or one role a node
    docker-compose build                                     # a stack does not build (load it on every node)
    kvtransit swarm run --rate 4 --requests 50

It deploys the stack (`-c` as `docker stack deploy -c`; default docker-stack.yml), waits until decode, the
middlebox, the prefill and Prometheus are healthy, starts the load generator, waits for it to finish, checks the
run's ledger, writes swarm.json (where each service ran, each phase's time, the ledger's verdict, the middlebox's
tc line) beside the report, and removes the stack and its networks, on failure and Ctrl-C too (not with --no-remove).
The scenario flags are `kvtransit up`'s; the stack runs one prefill and one decode without the KV pool, as compose
does. deploy/swarm/README.md has the labels, the offline images and the same steps by hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvtransit.cli._common import add_json_flag, print_json
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args


def register(subparsers) -> None:
    from kvtransit.harness.deploy.swarm.stack import DEFAULT_STACK_FILE, DEFAULT_STACK_NAME, SUMMARY_NAME
    from kvtransit.harness.deploy.swarm.stack_run import READY_TIMEOUT_S, RESOLVE_IMAGE, RUN_TIMEOUT_S

    p = subparsers.add_parser("swarm", help="the testbed as a Docker Swarm stack: deploy, run, gather, remove",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="swarm_command", metavar="ACTION", parser_class=type(p))
    sub.required = True
    r = sub.add_parser("run", help="one run of docker-stack.yml on this swarm, then remove it",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("-c", "--compose-file", dest="files", type=Path, action="append", default=None, metavar="FILE",
                   help=f"a stack file, as `docker stack deploy -c` (repeat to layer; default {DEFAULT_STACK_FILE})")
    r.add_argument("--stack", default=DEFAULT_STACK_NAME, metavar="NAME",
                   help=f"the stack's name, the prefix of its services and networks (default {DEFAULT_STACK_NAME})")
    r.add_argument("--runs-dir", type=Path, default=None, metavar="DIR",
                   help="where the report, the ledger (report.run/) and " + SUMMARY_NAME + " go; bind-mounted into "
                        "the load generator, on this node (default runs/YYYYmmdd-HHMMSS)")
    r.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S, metavar="SECONDS",
                   help=f"for the serving services to be healthy (default {READY_TIMEOUT_S:.0f})")
    r.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, metavar="SECONDS",
                   help=f"for the load generator's run (default {RUN_TIMEOUT_S:.0f})")
    r.add_argument("--resolve-image", choices=RESOLVE_IMAGE, default="never",
                   help="never (default): each node runs the image it has by name, no registry asked; "
                        "changed/always: pin a registry's digest (docker stack deploy --resolve-image)")
    r.add_argument("--no-remove", dest="keep", action="store_true", help="leave the stack deployed after the run")
    add_scenario_args(r)
    add_json_flag(r)
    r.set_defaults(func=run)


def run(args) -> int:
    import json

    from kvtransit.cli.up import default_report_path
    from kvtransit.harness.deploy.swarm.errors import StackRunFailed
    from kvtransit.harness.deploy.swarm.stack import DEFAULT_STACK_FILE
    from kvtransit.harness.deploy.swarm.stack_run import StackRun, run_stack
    from kvtransit.report.text import headline

    def log(line: str) -> None:  # progress to stderr under --json, which owns stdout
        print(f"kvtransit swarm: {line}", flush=True, file=sys.stderr if args.json else sys.stdout)

    runs_dir = args.runs_dir if args.runs_dir is not None else default_report_path().parent
    stack_run = StackRun(scenario=scenario_from_args(args), runs_dir=runs_dir, stack=args.stack,
                         files=tuple(args.files or (DEFAULT_STACK_FILE,)), ready_timeout_s=args.ready_timeout,
                         run_timeout_s=args.timeout, keep=args.keep, resolve_image=args.resolve_image)
    try:
        result = run_stack(stack_run, log=log)
    except StackRunFailed as exc:
        sys.stderr.write(f"kvtransit swarm: error: {exc}\n")
        return 1
    if args.json:
        print_json(result.summary)
    else:
        report = json.loads(result.report_path.read_text())
        for line in headline(report):
            print(line)
        ledger = result.summary["ledger"]
        print(f"ledger: {ledger['requests']} requests, ok {ledger['ok']}, slo-miss {ledger['slo_miss']}, failed "
              f"{ledger['failed_total']}, timed out {ledger['timed_out']}: "
              + ("pass" if result.verdict.ok else "FAIL: " + "; ".join(ledger["problems"])))
        print(f"link: {result.summary['link_shaper']}")
        placed = ", ".join(f"{name} on {service['node']}" for name, service in result.summary["services"].items())
        print(f"placed: {placed}")
        print(f"report: {result.report_path}, ledger: {result.ledger_path}, swarm: {result.summary_path}")
    return 0 if result.verdict.ok else 1
