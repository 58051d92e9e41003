"""The ciphertext flows' link (runtime/shaped_stream.py) on a ManualClock: each message reaches the socket
when the link model says, latency + its serialisation, queued FIFO behind the one before it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from kvtransit.runtime.clock import ManualClock
from kvtransit.runtime.shaped_stream import ShapedStreamWriter


async def test_messages_arrive_at_latency_plus_bytes_over_rate_fifo():
    left, right = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=left)
    reader, peer_writer = await asyncio.open_connection(sock=right)
    clock = ManualClock()
    link = ShapedStreamWriter(writer, rate_Bps=1000.0, latency_s=0.010, clock=clock)
    try:
        # 100 B at 1,000 B/s: serialised by 0.1 s, delivered at 0.11 s; the second 50 B queue behind it:
        # serialised by 0.15 s, delivered at 0.16 s.
        first = asyncio.create_task(link.send(b"a" * 100))
        second = asyncio.create_task(link.send(b"b" * 50))
        await clock.advance(0.109)
        assert not first.done()
        await clock.advance(0.001)
        assert await first == 110_000_000
        assert await reader.readexactly(100) == b"a" * 100
        await clock.advance(0.049)
        assert not second.done()
        await clock.advance(0.001)
        assert await second == 160_000_000
        assert await reader.readexactly(50) == b"b" * 50
        assert (link.counters.messages, link.counters.wire_bytes) == (2, 150)
        assert link.counters.busy_s == pytest.approx(0.15)
    finally:
        writer.close()
        peer_writer.close()
        await writer.wait_closed()
        await peer_writer.wait_closed()
