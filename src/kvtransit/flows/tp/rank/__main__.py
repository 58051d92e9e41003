"""A rank process: `python -m kvtransit.flows.tp.rank --config JSON` (started by flows/tp/run.py).

Protocol with its launcher, over its standard streams:
1. it binds (ring: its listening port) and prints the readiness line (agents/process.py);
2. it reads one JSON line on stdin: {"next": [host, port]} (ring) or {"switch": [host, port]}, and
   "start_ns" (the group's first step, on the host's monotonic clock, which every process here shares);
3. it joins the group, runs its steps and prints one `KVTRANSIT-RESULT {json}` line (rank.RankResult), then exits
   (0 whether or not the collective failed: a failed step is a result, with its reason).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from kvtransit.agents.process import (
    announce_ready,
    announce_result,
    read_go_line,
    run_config_process,
    unless_stopped,
)
from kvtransit.flows.tp.rank.join import connect_ring, switch_member
from kvtransit.flows.tp.rank.rank import MODE_RING, RANK_SPIN_S, RankPlan, RankResult, run_steps
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.channel import PeerGone
from kvtransit.runtime.group_link.connect import RingMember, close_channels


async def rank_main(config: dict[str, Any], stop: asyncio.Event) -> None:
    plan = RankPlan(**config["plan"])
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    rate_Bps, latency_s = float(config["rate_Bps"]), float(config["latency_s"])
    member = RingMember(plan, clock, rate_Bps=rate_Bps, latency_s=latency_s) if plan.mode == MODE_RING else None
    port = await member.listen() if member is not None else 0
    announce_ready("rank", f"rank-{plan.rank}", listen_port=port)
    algorithm = None
    try:
        go = await read_go_line()
        if member is not None:
            algorithm = await connect_ring(member, *go["next"])
        else:
            host, port = go["switch"]
            algorithm = await switch_member(plan, clock, str(host), int(port), rate_Bps=rate_Bps, latency_s=latency_s)
        done = await unless_stopped(run_steps(plan, clock, algorithm, int(go["start_ns"])), stop)
        result = done or RankResult(plan.rank, ok=False, reason=f"rank {plan.rank} was stopped")
    except (PeerGone, EOFError) as exc:
        result = RankResult(plan.rank, ok=False, reason=f"rank {plan.rank}: {exc}")
    finally:
        if algorithm is not None:
            await close_channels(algorithm)
        if member is not None:
            await member.close()
    announce_result(result.to_json())


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.flows.tp.rank",
                              "JSON: plan (RankPlan fields), rate_Bps, latency_s",
                              rank_main, argv)


if __name__ == "__main__":
    sys.exit(main())
