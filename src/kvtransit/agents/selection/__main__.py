"""A selection role's process: `python -m kvtransit.agents.selection --config JSON` (emulator/selection_run.py).

The protocol of the other live groups (agents/collective/__main__.py): the process binds what it serves (the pool:
the module's connection; the module: decode's) and prints the readiness line, reads one JSON go line on stdin
(the module: {"pool": [host, port]}; decode: {"scorer": [host, port], "start_ns": ...}), joins, runs, and prints
one `KVTRANSIT-RESULT {json}` line, then exits 0 whether or not the run failed (a failure is a result, with its
reason). Config: {"role": "pool" | "scorer" | "decode", "plan": SelectionPlan fields, "rate_Bps", "latency_s"}.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from kvtransit.agents.collective.channel import Channel, PeerGone
from kvtransit.agents.collective.connect import dial, expect_join, join
from kvtransit.agents.collective.rank import RANK_SPIN_S
from kvtransit.agents.common.process import (
    announce_ready,
    announce_result,
    read_go_line,
    run_config_process,
    unless_stopped,
)
from kvtransit.runtime.clock import Clock, MonotonicClock

from .context import RemoteContext
from .roles import (
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

# The module sits at decode's end of the link (a pluggable in decode's NIC): their hop is local, unshaped in
# effect (a rate no frame here notices, no latency), but stamped, so model time flows through it.
LOCAL_RATE_BPS = 1e15


class RoleResult(Protocol):
    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Seat:
    """Who a role is, as JOIN says it (agents/collective/channel.py: GroupMember)."""

    rank: int
    deadline_s: float
    group: int = GROUP
    size: int = 3


class _Acceptor:
    """Listen for the one peer a role serves (the pool: the module; the module: decode)."""

    def __init__(self) -> None:
        self.accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] | None = None
        self.server: asyncio.Server | None = None

    async def listen(self) -> int:
        self.accepted = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert self.accepted is not None
            if self.accepted.done():
                writer.close()
                return
            self.accepted.set_result((reader, writer))

        self.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def channel(self, seat: Seat, clock: Clock, peer_rank: int, *, rate_Bps: float, latency_s: float) -> Channel:
        assert self.accepted is not None
        try:
            async with asyncio.timeout(seat.deadline_s):
                reader, writer = await self.accepted
        except TimeoutError:
            raise PeerGone(f"{ROLE_NAMES[peer_rank]} did not connect within {seat.deadline_s:g} s") from None
        channel = Channel(reader, writer, clock, rate_Bps=rate_Bps, latency_s=latency_s, peer=ROLE_NAMES[peer_rank])
        await expect_join(seat, channel, peer_rank)
        return channel

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def _dial(seat: Seat, clock: Clock, where: list[Any], peer_rank: int, *, rate_Bps: float,
                latency_s: float) -> Channel:
    reader, writer = await dial(str(where[0]), int(where[1]), seat.deadline_s, ROLE_NAMES[peer_rank])
    channel = Channel(reader, writer, clock, rate_Bps=rate_Bps, latency_s=latency_s, peer=ROLE_NAMES[peer_rank])
    await join(seat, channel)
    return channel


async def _play(rank: int, plan: SelectionPlan, ctx: RemoteContext, clock: Clock, go: dict[str, Any],
                acceptor: _Acceptor | None, channels: list[Channel], *, rate: float, latency: float) -> RoleResult:
    """Join the role's peers (each channel kept in `channels`, for the caller to close) and play the role."""
    seat = Seat(rank, plan.deadline_s)
    if rank == ROLE_POOL:
        assert acceptor is not None
        channels.append(await acceptor.channel(seat, clock, ROLE_SCORER, rate_Bps=rate, latency_s=latency))
        return await serve_pool(plan, ctx, channels[0])
    if rank == ROLE_SCORER:
        assert acceptor is not None
        channels.append(await _dial(seat, clock, go["pool"], ROLE_POOL, rate_Bps=rate, latency_s=latency))
        channels.append(await acceptor.channel(seat, clock, ROLE_DECODE, rate_Bps=LOCAL_RATE_BPS, latency_s=0.0))
        return await serve_scorer(plan, ctx, channels[1], channels[0])
    channels.append(await _dial(seat, clock, go["scorer"], ROLE_SCORER, rate_Bps=LOCAL_RATE_BPS, latency_s=0.0))
    return await run_decode(plan, ctx, clock, channels[0], int(go["start_ns"]))


async def role_main(config: dict[str, Any], stop: asyncio.Event) -> None:
    role = str(config["role"])
    plan = SelectionPlan(**config["plan"])
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    ctx = RemoteContext.load(plan.sample, plan.text, plan.page_size, plan.wire_dtype)
    rank = {"pool": ROLE_POOL, "scorer": ROLE_SCORER, "decode": ROLE_DECODE}[role]
    acceptor = _Acceptor() if rank != ROLE_DECODE else None
    port = await acceptor.listen() if acceptor is not None else 0
    announce_ready(f"selection-{role}", role, listen_port=port)
    channels: list[Channel] = []
    result: RoleResult
    empty = {ROLE_POOL: PoolResult, ROLE_SCORER: ScorerResult, ROLE_DECODE: DecodeResult}[rank]
    try:
        go = await read_go_line()
        done = await unless_stopped(_play(rank, plan, ctx, clock, go, acceptor, channels,
                                          rate=float(config["rate_Bps"]), latency=float(config["latency_s"])), stop)
        result = done or empty(ok=False, reason=f"the {role} was stopped")
    except (PeerGone, EOFError) as exc:
        result = empty(ok=False, reason=f"the {role}: {exc}")
    finally:
        for channel in channels:
            await channel.close()
        if acceptor is not None:
            await acceptor.close()
    announce_result({"role": role, **result.to_json()})


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.agents.selection",
                              "JSON: role, plan (SelectionPlan fields), rate_Bps, latency_s",
                              role_main, argv)


if __name__ == "__main__":
    sys.exit(main())
