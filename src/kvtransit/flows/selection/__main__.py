"""A selection role's process: `python -m kvtransit.flows.selection --config JSON` (flows/selection/run.py).

A run-to-end process (agents/run_to_end.py): it binds what it serves (the pool: the module's connection; the
module: decode's); its go line is {"pool": [host, port]} (the module) or {"scorer": [host, port], "start_ns": ...}
(decode); it joins, runs, and prints its result line. Config: {"role": "pool" | "scorer" | "decode", "plan":
SelectionPlan fields, "rate_Bps", "latency_s"}.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from kvtransit.agents.run_to_end import Outcome, run_config_process, run_to_end
from kvtransit.flows.selection.context import RemoteContext
from kvtransit.flows.selection.roles import (
    GROUP,
    ROLE_DECODE,
    ROLE_NAMES,
    ROLE_POOL,
    ROLE_SCORER,
    DecodeResult,
    PoolResult,
    ScorerResult,
    SelectionPlan,
    run_decode,
    serve_pool,
    serve_scorer,
)
from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.runtime.group_link.channel import Channel
from kvtransit.runtime.group_link.connect import PeerListener, Seat, dial_member
from kvtransit.runtime.group_link.timing import RANK_SPIN_S

# The module sits at decode's end of the link (a pluggable in decode's NIC): their hop is local, unshaped in
# effect (a rate no frame here notices, no latency), but stamped, so model time flows through it.
LOCAL_RATE_BPS = 1e15


async def _play(rank: int, plan: SelectionPlan, ctx: RemoteContext, clock: Clock, go: dict[str, Any],
                listener: PeerListener | None, channels: list[Channel], *, rate: float, latency: float) -> Outcome:
    """Join the role's peers (each channel kept in `channels`, for the caller to close) and play the role."""
    seat = Seat(GROUP, rank, len(ROLE_NAMES), plan.deadline_s)

    async def accept(peer: int, rate_Bps: float, latency_s: float) -> Channel:
        assert listener is not None
        channel = await listener.channel(seat, clock, peer, ROLE_NAMES[peer], rate_Bps=rate_Bps, latency_s=latency_s)
        channels.append(channel)
        return channel

    async def dial(peer: int, where: list[Any], rate_Bps: float, latency_s: float) -> Channel:
        channel = await dial_member(seat, clock, where, peer, ROLE_NAMES[peer], rate_Bps=rate_Bps,
                                    latency_s=latency_s)
        channels.append(channel)
        return channel

    if rank == ROLE_POOL:
        return await serve_pool(plan, ctx, await accept(ROLE_SCORER, rate, latency))
    if rank == ROLE_SCORER:
        pool = await dial(ROLE_POOL, go["pool"], rate, latency)
        return await serve_scorer(plan, ctx, await accept(ROLE_DECODE, LOCAL_RATE_BPS, 0.0), pool)
    return await run_decode(plan, ctx, clock, await dial(ROLE_SCORER, go["scorer"], LOCAL_RATE_BPS, 0.0),
                            int(go["start_ns"]))


async def role_main(config: dict[str, Any], stop: asyncio.Event) -> None:
    role = str(config["role"])
    plan = SelectionPlan(**config["plan"])
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    ctx = RemoteContext.load(plan.sample, plan.text, plan.page_size, plan.wire_dtype)
    rank = {"pool": ROLE_POOL, "scorer": ROLE_SCORER, "decode": ROLE_DECODE}[role]
    listener = PeerListener() if rank != ROLE_DECODE else None
    port = await listener.listen() if listener is not None else 0
    channels: list[Channel] = []

    async def close() -> None:
        for channel in channels:
            await channel.close()
        if listener is not None:
            await listener.close()

    empty = {ROLE_POOL: PoolResult, ROLE_SCORER: ScorerResult, ROLE_DECODE: DecodeResult}[rank]
    rate, latency = float(config["rate_Bps"]), float(config["latency_s"])
    await run_to_end(stop, role=f"selection-{role}", name=role, who=f"the {role}", ports={"listen_port": port},
                     play=lambda go: _play(rank, plan, ctx, clock, go, listener, channels, rate=rate, latency=latency),
                     close=close, failed=lambda reason: empty(ok=False, reason=reason), labels={"role": role})


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.flows.selection",
                              "JSON: role, plan (SelectionPlan fields), rate_Bps, latency_s",
                              role_main, argv)


if __name__ == "__main__":
    sys.exit(main())
