"""What the agent subcommands share: their address flags, logging to stderr, and running on the chosen loop."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtransit.agents.skeleton import Agent


def add_common_agent_flags(parser: argparse.ArgumentParser, role: str) -> None:
    parser.add_argument("--name", default=f"{role}-0",
                        help=f"this process's name in logs and reports (default {role}-0)")
    parser.add_argument("--metrics-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="where /metrics and /stats are served (default 127.0.0.1:0, any free port)")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="event loop (default auto)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="warning")


def add_client_flags(parser: argparse.ArgumentParser, *, drain_help: str) -> None:
    """What every client of the testbed (the load generator, the OpenAI front end) is told: its peers, and where
    its report and ledger go."""
    parser.add_argument("--prefill", dest="prefill_at", required=True, metavar="HOST:PORT[,HOST:PORT...]",
                        help="prefill instances to send requests to")
    parser.add_argument("--decode-clients", required=True, metavar="HOST:PORT[,HOST:PORT...]",
                        help="decode instances' client ports (tokens come from there)")
    parser.add_argument("--stats", default="", metavar="HOST:PORT[,HOST:PORT...]",
                        help="agents' metrics addresses whose /stats join the report")
    parser.add_argument("--report", type=Path, default=None, metavar="PATH",
                        help="write the report here as JSON (and beside it as .md)")
    parser.add_argument("--ledger", type=Path, default=None, metavar="PATH",
                        help="the request ledger (JSONL, append-only; default REPORT.run/ledger.jsonl when "
                             "--report is set)")
    parser.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS", help=drain_help)


def setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def run_agent(args: argparse.Namespace, agent: Agent) -> int:
    """Serve `agent` (agents/skeleton.py: one lifecycle for every role) until SIGINT/SIGTERM stops it."""
    from kvtransit.agents.skeleton import serve

    return run_main(args, lambda stop: serve(agent, stop))


def run_main(args: argparse.Namespace, main) -> int:
    """Run `main(stop)` until it returns or SIGINT/SIGTERM stops it, on the chosen loop, logging to stderr."""
    from kvtransit.agents.process import run_until_stopped
    from kvtransit.runtime.loop import run

    setup_logging(args.log_level)
    run(run_until_stopped(main), loop=args.loop)
    return 0


def flow_args(args: argparse.Namespace) -> dict:
    """The parsed flags as the flows' parts read them (agents/plugins.py), by name."""
    return vars(args)
