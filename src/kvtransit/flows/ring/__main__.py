"""A ring attention rank process: `python -m kvtransit.flows.ring --config JSON` (started by flows/ring/run.py).

A run-to-end process (agents/run_to_end.py): it loads its blocks and binds its listening port; its go line is
{"next": [host, port], "start_ns": ...}; it joins the ring, runs its prompts and its result line is
rank.RingRankResult.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from kvtransit.agents.run_to_end import run_config_process, run_to_end
from kvtransit.flows.ring.blocks import RingKV
from kvtransit.flows.ring.rank import RingRank, RingRankPlan, RingRankResult
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.channel import Channel
from kvtransit.runtime.group_link.connect import RingMember
from kvtransit.runtime.group_link.timing import RANK_SPIN_S


async def rank_main(config: dict[str, Any], stop: asyncio.Event) -> None:
    plan = RingRankPlan(**config["plan"])
    # A hop's hold at the dilations this runs at is a millisecond or so, n ranks on 2 cores: the TP ranks' spin.
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    kv = RingKV.load(plan.sample, plan.text, plan.size)
    member = RingMember(plan, clock, rate_Bps=float(config["rate_Bps"]), latency_s=float(config["latency_s"]))
    channels: list[Channel] = []

    async def play(go: dict[str, Any]) -> RingRankResult:
        channels.extend(await member.connect_channels(*go["next"]))
        return await RingRank(plan, clock, channels[0], channels[1], kv).run(int(go["start_ns"]))

    async def close() -> None:
        for channel in channels:
            await channel.close()
        await member.close()

    await run_to_end(stop, role="ring-rank", name=f"ring-rank-{plan.rank}", who=f"rank {plan.rank}",
                     ports={"listen_port": await member.listen()}, play=play, close=close,
                     failed=lambda reason: RingRankResult(plan.rank, ok=False, reason=reason))


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.flows.ring",
                              "JSON: plan (RingRankPlan fields), rate_Bps, latency_s",
                              rank_main, argv)


if __name__ == "__main__":
    sys.exit(main())
