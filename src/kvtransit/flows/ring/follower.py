"""A follower rank of a prefill's ring inside `kvtransit up`: `python -m kvtransit.flows.ring.follower --config JSON`
(group.py: RingFollowerConfig).

It binds its control port and its ring port and prints its readiness line; the launcher starts it before its
prefill and hands the prefill its ports. The prefill (rank 0) dials the control port and says GO (where the next
rank listens); the follower joins the ring, then runs each ORDER's prompt (flows/ring/rank.py: `RingRank.prompt`,
its block passed on and its blockwise attention held, layer by layer) and answers DONE. A failure (a peer gone, a
deadline, a frame out of order) is an ABORT with the reason to the prefill and round the ring, and ends the process
with a result line; so does the prefill's leaving (the run's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import replace
from typing import Any

from kvtransit.agents.process import announce_ready, announce_result, unless_stopped
from kvtransit.agents.run_to_end import run_config_process
from kvtransit.flows.ring.group import RingFollowerConfig, rank_plan, read_order, ring_blocks
from kvtransit.flows.ring.rank import RingFailed, RingRank
from kvtransit.flows.ring.section import RingSection
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.channel import Channel, PeerGone
from kvtransit.runtime.group_link.connect import PeerListener, RingMember
from kvtransit.runtime.group_link.follow import follow_orders, read_go
from kvtransit.runtime.group_link.timing import LEADER_DIAL_S, RANK_SPIN_S
from kvtransit.wire.group import Frame, abort


async def follower_main(config: RingFollowerConfig, stop: asyncio.Event) -> dict[str, Any]:
    scenario = Scenario.build(**config.scenario)
    plan = rank_plan(scenario, config.index, config.rank)
    link = RingSection.of(scenario).scaled_link(scenario)
    # A hop's hold at the dilations this runs at is a millisecond or so, n ranks on 2 cores: the TP ranks' spin.
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    member = RingMember(plan, clock, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s)
    control_listener = PeerListener()
    control_port = await control_listener.listen(config.host)
    ring_port = await member.listen(config.host)
    announce_ready("ring-rank", f"{config.leader}-ring-{config.rank}", control_port=control_port, ring_port=ring_port)
    result: dict[str, Any] = {"rank": config.rank, "ok": True, "reason": "", "prompts": 0}
    control: Channel | None = None
    rank: RingRank | None = None
    try:
        # The prefill dials once it has started: wait for it that long, not a hop's deadline.
        control = await control_listener.channel(replace(plan, deadline_s=LEADER_DIAL_S), clock, 0,
                                                 f"the prefill ({config.leader})", rate_Bps=link.bandwidth_Bps,
                                                 latency_s=link.latency_s)
        where = read_go(await control.receive(plan.deadline_s, "GO"))
        prev, nxt = await member.connect_channels(*where["next"])
        rank = RingRank(plan, clock, prev, nxt, ring_blocks(scenario))
        await unless_stopped(_serve_orders(control, rank, result), stop)  # a signal stops it between hops too
    except (PeerGone, RingFailed) as exc:
        result.update(ok=False, reason=str(exc))
        if control is not None:
            await control.send_quietly(abort(plan.group, str(exc), rank=plan.rank))
        if rank is not None:
            await rank.next.send_quietly(abort(plan.group, str(exc), rank=plan.rank))
    finally:
        if rank is not None:
            r = rank.result
            result.update(hops=r.hops, raw_bytes=r.raw_bytes, wire_bytes=r.wire_bytes, late_s=rank.prev.late_ns / 1e9)
            for channel in (rank.prev, rank.next):
                with contextlib.suppress(Exception):
                    await channel.close()
        if control is not None:
            await control.close()
        await control_listener.close()
        await member.close()
    return result


async def _serve_orders(control: Channel, rank: RingRank, result: dict[str, Any]) -> None:
    """Each ORDER in turn until the prefill leaves (its BYE or EOF: the run's end) or says ABORT."""
    async def carry_out(frame: Frame) -> None:
        await rank.prompt(frame.step, read_order(frame))
        result["prompts"] += 1

    await follow_orders(control, rank.plan.group, rank.plan.rank, carry_out, order="ring prompt",
                        who=f"ring rank {rank.plan.rank}", failed=RingFailed)


async def run(config_json: dict[str, Any], stop: asyncio.Event) -> None:
    announce_result(await follower_main(RingFollowerConfig(**config_json), stop))


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.flows.ring.follower",
                              "JSON: RingFollowerConfig fields (index, rank, host, leader, scenario)", run, argv)


if __name__ == "__main__":
    sys.exit(main())
