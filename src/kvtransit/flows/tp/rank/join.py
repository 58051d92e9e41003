"""A rank joining its group's all-reduce: a ring member's channels made into the ring algorithm, or a switch member's
one channel to the switch (the joining itself is runtime/group_link/connect.py's, shared with ring attention)."""

from __future__ import annotations

from kvtransit.flows.tp.rank.rank import AllReduce, RankPlan, ring, switch
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.channel import Channel
from kvtransit.runtime.group_link.connect import RingMember, dial, join


async def connect_ring(member: RingMember, next_host: str, next_port: int) -> AllReduce:
    """Dial the next rank, accept the previous one: the all-reduce's ring of them."""
    assert isinstance(member.plan, RankPlan), "an all-reduce ring is made of RankPlans"
    return ring(member.plan, *await member.connect_channels(next_host, next_port))


async def switch_member(plan: RankPlan, clock: Clock, host: str, port: int, *, rate_Bps: float,
                        latency_s: float) -> AllReduce:
    """Dial the switch and say JOIN: the all-reduce through it."""
    reader, writer = await dial(host, port, plan.deadline_s, "the switch")
    channel = Channel(reader, writer, clock, rate_Bps=rate_Bps, latency_s=latency_s, peer="the switch")
    await join(plan, channel)
    return switch(plan, channel)
