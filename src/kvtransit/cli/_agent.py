"""What the agent subcommands share: their address flags, logging to stderr, and running on the chosen loop."""

from __future__ import annotations

import argparse
import logging
import sys


def add_common_agent_flags(parser: argparse.ArgumentParser, role: str) -> None:
    parser.add_argument("--name", default=f"{role}-0",
                        help=f"this process's name in logs and reports (default {role}-0)")
    parser.add_argument("--metrics-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="where /metrics and /stats are served (default 127.0.0.1:0, any free port)")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="event loop (default auto)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="warning")


def setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def run_agent(args: argparse.Namespace, make_main) -> int:
    """Run `make_main()` → coroutine function(stop) until it returns or SIGINT/SIGTERM stops it."""
    from kvtransit.agents.common.process import run_until_stopped
    from kvtransit.runtime.loop import run

    setup_logging(args.log_level)
    run(run_until_stopped(make_main()), loop=args.loop)
    return 0
