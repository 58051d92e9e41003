"""A ring attention rank process: `python -m kvtransit.flows.ring --config JSON` (started by flows/ring/run.py).

The same protocol as a TP rank's (flows/tp/rank/__main__.py): it loads its blocks and binds its listening
port, prints the readiness line, reads one JSON go line on stdin ({"next": [host, port], "start_ns": ...}), joins
the ring, runs its prompts and prints one `KVTRANSIT-RESULT {json}` line (rank.RingRankResult), then exits 0
whether or not the prompt failed (a failure is a result, with its reason).
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
from kvtransit.flows.ring.blocks import RingKV
from kvtransit.flows.ring.rank import RingRank, RingRankPlan, RingRankResult
from kvtransit.flows.tp.rank.rank import RANK_SPIN_S
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.channel import PeerGone
from kvtransit.runtime.group_link.connect import RingMember


async def rank_main(config: dict[str, Any], stop: asyncio.Event) -> None:
    plan = RingRankPlan(**config["plan"])
    # A hop's hold at the dilations this runs at is a millisecond or so, n ranks on 2 cores: the TP ranks' spin.
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    kv = RingKV.load(plan.sample, plan.text, plan.size)
    member = RingMember(plan, clock, rate_Bps=float(config["rate_Bps"]), latency_s=float(config["latency_s"]))
    port = await member.listen()
    announce_ready("ring-rank", f"ring-rank-{plan.rank}", listen_port=port)
    channels = None
    try:
        go = await read_go_line()
        channels = await member.connect_channels(*go["next"])
        done = await unless_stopped(RingRank(plan, clock, *channels, kv).run(int(go["start_ns"])), stop)
        result = done or RingRankResult(plan.rank, ok=False, reason=f"rank {plan.rank} was stopped")
    except (PeerGone, EOFError) as exc:
        result = RingRankResult(plan.rank, ok=False, reason=f"rank {plan.rank}: {exc}")
    finally:
        for channel in channels or ():
            await channel.close()
        await member.close()
    announce_result(result.to_json())


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.flows.ring",
                              "JSON: plan (RingRankPlan fields), rate_Bps, latency_s",
                              rank_main, argv)


if __name__ == "__main__":
    sys.exit(main())
