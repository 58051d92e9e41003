"""Joining a group over TCP: a ring member listens for its previous rank and dials its next; a switch member
dials the switch. Both say JOIN first, so a wrong peer is found before any step.

A ring of any kind joins the same way: the TP all-reduce's ranks (rank.py) and ring attention's (flows/ring) both
take `RingMember.connect_channels`; `connect` makes the all-reduce's ring of them."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.channel import Channel, GroupMember, PeerGone
from kvtransit.wire.group import Frame, Kind

DIAL_RETRY_S = 0.05


async def dial(host: str, port: int, deadline_s: float, what: str) -> tuple[asyncio.StreamReader,
                                                                              asyncio.StreamWriter]:
    """Connect, retrying while the peer is still starting; PeerGone naming `what` after `deadline_s`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline_s
    while True:
        try:
            return await asyncio.open_connection(host, port)
        except OSError as exc:
            if loop.time() >= give_up:
                raise PeerGone(f"could not reach {what} at {host}:{port} within {deadline_s:g} s: {exc}") from None
            await asyncio.sleep(DIAL_RETRY_S)  # a start-up retry, no model time


async def join(member: GroupMember, channel: Channel) -> None:
    """Say who we are on a fresh connection (the switch checks the group; a ring neighbour the rank)."""
    await channel.send(Frame(Kind.JOIN, member.group, rank=member.rank, chunk=member.size), shaped=False)


async def expect_join(member: GroupMember, channel: Channel, rank: int) -> None:
    frame = await channel.receive(member.deadline_s, f"rank {rank}'s JOIN")
    if (frame.kind, frame.group, frame.rank, frame.chunk) != (Kind.JOIN, member.group, rank, member.size):
        raise PeerGone(f"expected JOIN of rank {rank} in group {member.group} of {member.size}, got "
                       f"{frame.kind.name} group {frame.group} rank {frame.rank} of {frame.chunk}")


@dataclass(frozen=True)
class Seat:
    """Who a process is in a group of named roles (a selection's pool, module and decode; a store and its
    instance), as JOIN says it (channel.py: GroupMember)."""

    group: int
    rank: int
    size: int
    deadline_s: float


class PeerListener:
    """Listen for the one peer a process serves (its port goes in the readiness line), then take its JOIN."""

    def __init__(self) -> None:
        self._accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] | None = None
        self._server: asyncio.Server | None = None

    async def listen(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._accepted = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert self._accepted is not None
            if self._accepted.done():
                writer.close()  # one peer only
                return
            self._accepted.set_result((reader, writer))

        self._server = await asyncio.start_server(accept, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def channel(self, me: GroupMember, clock: Clock, peer_rank: int, peer: str, *, rate_Bps: float,
                      latency_s: float) -> Channel:
        assert self._accepted is not None, "listen() first"
        try:
            async with asyncio.timeout(me.deadline_s):
                reader, writer = await self._accepted
        except TimeoutError:
            raise PeerGone(f"{peer} did not connect within {me.deadline_s:g} s") from None
        channel = Channel(reader, writer, clock, rate_Bps=rate_Bps, latency_s=latency_s, peer=peer)
        await expect_join(me, channel, peer_rank)
        return channel

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()


async def dial_member(me: GroupMember, clock: Clock, where: list[Any], peer_rank: int, peer: str, *,
                      rate_Bps: float, latency_s: float) -> Channel:
    """Dial `peer` at `where` ([host, port]) and say JOIN."""
    reader, writer = await dial(str(where[0]), int(where[1]), me.deadline_s, peer)
    channel = Channel(reader, writer, clock, rate_Bps=rate_Bps, latency_s=latency_s, peer=peer)
    await join(me, channel)
    return channel


class RingMember:
    """Listen first (the port goes in the readiness line), then `connect` to the next rank."""

    def __init__(self, plan: GroupMember, clock: Clock, *, rate_Bps: float, latency_s: float):
        self.plan, self.clock = plan, clock
        self.rate_Bps, self.latency_s = rate_Bps, latency_s
        self._listener = PeerListener()  # for the previous rank

    async def listen(self, host: str = "127.0.0.1", port: int = 0) -> int:
        return await self._listener.listen(host, port)

    async def connect_channels(self, next_host: str, next_port: int) -> tuple[Channel, Channel]:
        """Dial the next rank, accept the previous one, each saying JOIN: (from the previous, to the next)."""
        plan = self.plan
        nxt_rank, prev_rank = (plan.rank + 1) % plan.size, (plan.rank - 1) % plan.size
        nxt = await dial_member(plan, self.clock, [next_host, next_port], nxt_rank, f"rank {nxt_rank}",
                                rate_Bps=self.rate_Bps, latency_s=self.latency_s)
        prev = await self._listener.channel(plan, self.clock, prev_rank, f"rank {prev_rank}", rate_Bps=self.rate_Bps,
                                            latency_s=self.latency_s)
        await self._listener.close()  # the ring is made: no more connections
        return prev, nxt

    async def close(self) -> None:
        await self._listener.close()


async def close_channels(algorithm) -> None:
    for channel in algorithm.channels:
        await channel.close()
