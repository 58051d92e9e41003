"""A follower rank of a prefill's or decode's TP group: `python -m kvtransit.flows.tp.group --config JSON`
(FollowerConfig).

It binds its control port (and, in a ring, its ring port) and prints its readiness line; the launcher starts it
before its leader and hands the leader its ports. The leader (the prefill or decode, rank 0) dials the control port
and says GO (where the next rank or the switch is); the follower joins the ring or the switch, then does what each
STEP order says: at the order's time, its part of that step's real all-reduce, the sum checked exact, then DONE.
A failure (a peer gone, a deadline, a wrong sum) is an ABORT with the reason to the leader and onwards, and ends
the process with a result line; so does the leader's leaving (the run's end). Its compute is not held here: the
group's step is the leader's to hold, and a follower only has to be at the all-reduce when the order says.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from kvtransit.agents.process import announce_ready, announce_result, unless_stopped
from kvtransit.flows.tp.group.exact_step import ExactStep
from kvtransit.flows.tp.group.orders import FollowerConfig, read_step
from kvtransit.flows.tp.rank.join import connect_ring, switch_member
from kvtransit.flows.tp.rank.rank import MODE_RING, CollectiveFailed
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.channel import Channel, PeerGone
from kvtransit.runtime.group_link.connect import PeerListener, RingMember, close_channels
from kvtransit.runtime.group_link.follow import follow_orders, read_go
from kvtransit.runtime.group_link.timing import LEADER_DIAL_S, RANK_SPIN_S
from kvtransit.wire.group import Frame, Kind, abort


async def follower_main(config: FollowerConfig, stop: asyncio.Event) -> dict[str, Any]:
    plan = config.plan()
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    ring = RingMember(plan, clock, rate_Bps=config.rate_Bps, latency_s=config.latency_s) \
        if config.mode == MODE_RING else None
    control_listener = PeerListener()
    control_port = await control_listener.listen(config.host)
    ring_port = await ring.listen(config.host) if ring is not None else 0
    announce_ready("tp-rank", f"{config.leader}-rank-{config.rank}", control_port=control_port,
                   ring_port=ring_port)
    result: dict[str, Any] = {"rank": config.rank, "ok": True, "reason": "", "steps": 0, "sums_checked": 0,
                              "late_s": 0.0}
    control: Channel | None = None
    step: ExactStep | None = None
    try:
        # The leader dials once it has started: wait for it that long, not a collective's deadline.
        control = await control_listener.channel(replace(plan, deadline_s=LEADER_DIAL_S), clock, 0,
                                                 f"the leader ({config.leader})", rate_Bps=config.rate_Bps,
                                                 latency_s=config.latency_s)
        where = read_go(await control.receive(plan.deadline_s, "GO"))
        if ring is not None:
            algorithm = await connect_ring(ring, *where["next"])
        else:
            algorithm = await switch_member(plan, clock, str(where["switch"][0]), int(where["switch"][1]),
                                            rate_Bps=config.rate_Bps, latency_s=config.latency_s)
        step = ExactStep(plan, algorithm)
        await unless_stopped(_serve_orders(control, step, result), stop)  # a signal stops it between hops too
    except (PeerGone, CollectiveFailed) as exc:
        result.update(ok=False, reason=str(exc))
        if control is not None:
            await control.send_quietly(abort(plan.group, str(exc), rank=plan.rank))
        if step is not None:
            await step.algorithm.fail(str(exc))
    finally:
        if step is not None:
            result["sums_checked"], result["late_s"] = step.sums_checked, step.late_ns / 1e9
            if result["ok"]:  # the ring or the switch hears that this rank is done, not that it broke
                for channel in step.algorithm.channels:
                    await channel.send_quietly(Frame(Kind.BYE, plan.group, rank=plan.rank))
            await close_channels(step.algorithm)
        if control is not None:
            await control.close()
        await control_listener.close()
        if ring is not None:
            await ring.close()
    return result


async def _serve_orders(control: Channel, step: ExactStep, result: dict[str, Any]) -> None:
    """Each STEP order in turn until the leader leaves (its BYE or EOF: the run's end) or says ABORT."""
    async def carry_out(frame: Frame) -> None:
        values, alltoall_values, at_ns = read_step(frame)
        await step.run(frame.step, values, at_ns, alltoall_values)
        result["steps"] += 1

    await follow_orders(control, step.plan.group, step.plan.rank, carry_out, order="step",
                        who=f"rank {step.plan.rank}", failed=CollectiveFailed)


async def run(config_json: dict[str, Any], stop: asyncio.Event) -> None:
    config = FollowerConfig(**config_json)
    done = await follower_main(config, stop)
    announce_result(done)
