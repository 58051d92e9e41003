"""One direction of an emulated link on an asyncio byte stream: serialised at the link's rate, released one
latency later, as the middlebox's egress shaper does (the same TokenBucket and DelayLine, shaping/userspace.py).

For flows whose messages are not wire frames (a key exchange, FHE ciphertexts). Each message is reserved on the
bucket when it is sent (burst 0: N bytes take exactly N / rate, docs/reference.md §2) and written to the socket when its
last byte would arrive (latency after its serialisation ends), whole: a receiver sees each message at the time
the link model says it completes. Messages are sent one at a time per direction (a handshake's messages are),
so no slicing is needed for timing at the message's end. `shaped_loopback` makes one such connection, shaped both
ways, for a flow's client and server in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.shaping.userspace import DelayLine, TokenBucket


@dataclass
class LinkCounters:
    messages: int = 0
    wire_bytes: int = 0
    busy_s: float = 0.0  # serialisation time (bytes / rate), what link busy sums (docs/reference.md §2)


class ShapedStreamWriter:
    """Writes messages onto `writer` as a link of `rate_Bps` and `latency_s` would deliver them."""

    def __init__(self, writer: asyncio.StreamWriter, *, rate_Bps: float, latency_s: float,
                 clock: Clock | None = None) -> None:
        self._writer = writer
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.rate_Bps = float(rate_Bps)
        self._bucket = TokenBucket(rate_Bps, 0)  # validates the rate (ShapingError)
        self._delay = DelayLine(latency_s)  # validates the latency
        self.counters = LinkCounters()

    async def send(self, data: bytes) -> int:
        """Returns when `data` has been handed to the socket, at its modelled arrival; the result is that time
        (clock ns)."""
        now_s = self.clock.now_ns() / 1e9
        serialised_s = self._bucket.reserve(len(data), now_s)
        arrival_ns = round(self._delay.release_time(serialised_s) * 1e9)
        await self.clock.sleep_until(arrival_ns)
        self._writer.write(data)
        await self._writer.drain()
        self.counters.messages += 1
        self.counters.wire_bytes += len(data)
        self.counters.busy_s += len(data) / self.rate_Bps
        return arrival_ns

    def close(self) -> None:
        self._writer.close()

    async def wait_closed(self) -> None:
        await self._writer.wait_closed()


Serve = Callable[[asyncio.StreamReader, ShapedStreamWriter], Awaitable[None]]


@dataclass
class ShapedConnection:
    """The client's side of a `shaped_loopback` connection, and `served`: done when the server's side returned
    (or failed with what it raised)."""

    reader: asyncio.StreamReader
    link: ShapedStreamWriter
    served: asyncio.Future[None]


@contextlib.asynccontextmanager
async def shaped_loopback(serve: Serve, *, rate_Bps: float, latency_s: float,
                          clock: Clock) -> AsyncIterator[ShapedConnection]:
    """One loopback TCP connection shaped each way at (rate_Bps, latency_s): `serve` runs the server's side with its
    reader and shaped writer; the caller gets the client's side. Both ends and the listener are closed on exit."""
    served: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve(reader, ShapedStreamWriter(writer, rate_Bps=rate_Bps, latency_s=latency_s, clock=clock))
        except BaseException as exc:
            if not served.done():
                served.set_exception(exc)
            raise
        finally:
            writer.close()
        if not served.done():
            served.set_result(None)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            yield ShapedConnection(reader, ShapedStreamWriter(writer, rate_Bps=rate_Bps, latency_s=latency_s,
                                                              clock=clock), served)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
