"""`python -m kvtransit.flows.tp.group --config JSON`: a decode TP group's follower rank (follower.py)."""

from __future__ import annotations

import sys

from kvtransit.agents.run_to_end import run_config_process
from kvtransit.flows.tp.group.follower import run


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.flows.tp.group",
                              "JSON: FollowerConfig fields (group, rank, size, mode, rate_Bps, latency_s, ...)", run,
                              argv)


if __name__ == "__main__":
    sys.exit(main())
