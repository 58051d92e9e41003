"""A rank process: `python -m kvtransit.flows.tp.rank --config JSON` (started by flows/tp/run.py).

A run-to-end process (agents/run_to_end.py): a ring rank binds its listening port (a switch's binds nothing); its
go line is {"next": [host, port]} (ring) or {"switch": [host, port]}, and "start_ns"; it joins the group, runs
its steps and its result line is rank.RankResult (a failed step is a result, with its reason).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from kvtransit.agents.run_to_end import run_config_process, run_to_end
from kvtransit.flows.tp.rank.join import connect_ring, switch_member
from kvtransit.flows.tp.rank.rank import MODE_RING, AllReduce, RankPlan, RankResult, run_steps
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.connect import RingMember, close_channels
from kvtransit.runtime.group_link.timing import RANK_SPIN_S


async def rank_main(config: dict[str, Any], stop: asyncio.Event) -> None:
    plan = RankPlan(**config["plan"])
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    rate_Bps, latency_s = float(config["rate_Bps"]), float(config["latency_s"])
    member = RingMember(plan, clock, rate_Bps=rate_Bps, latency_s=latency_s) if plan.mode == MODE_RING else None
    joined: list[AllReduce] = []  # the all-reduce, once joined (its channels closed at the end)

    async def play(go: dict[str, Any]) -> RankResult:
        if member is not None:
            joined.append(await connect_ring(member, *go["next"]))
        else:
            host, port = go["switch"]
            joined.append(await switch_member(plan, clock, str(host), int(port), rate_Bps=rate_Bps,
                                              latency_s=latency_s))
        return await run_steps(plan, clock, joined[0], int(go["start_ns"]))

    async def close() -> None:
        for algorithm in joined:
            await close_channels(algorithm)
        if member is not None:
            await member.close()

    await run_to_end(stop, role="rank", name=f"rank-{plan.rank}", who=f"rank {plan.rank}",
                     ports={"listen_port": await member.listen() if member is not None else 0}, play=play,
                     close=close, failed=lambda reason: RankResult(plan.rank, ok=False, reason=reason))


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.flows.tp.rank",
                              "JSON: plan (RankPlan fields), rate_Bps, latency_s",
                              rank_main, argv)


if __name__ == "__main__":
    sys.exit(main())
