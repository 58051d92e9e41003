"""The asyncio.BufferedProtocol joined to one sans-IO wire Connection, with its flow control.

`FramedProtocol` is what a transport (a TCP socket, or `memory.MemoryTransport`) talks to: the transport
reads straight into the connection's receive buffer (`get_buffer` / `buffer_updated`: no copy on the way
in), and the protocol turns the transport's callbacks into what `Endpoint` awaits: data arrived, the
write buffer drained, the connection is gone. `FlowLimits` are its bounds:

- sends wait (`drain`) while the transport's write buffer is above `write_high_bytes`, until it is back
  below `write_low_bytes`;
- reading pauses when more than `read_high_bytes` have arrived that the consumer has not asked for yet.

It holds no policy of its own about events: `Endpoint` (endpoint.py) decides when reading pauses for a
lent payload view and when a send must wait for an empty write buffer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from kvtransit.runtime.transport.tcp_options import LINK_CONGESTION_CONTROL, keep_alive, use_congestion_control
from kvtransit.wire import Connection
from kvtransit.wire.events import KvEnd, Role
from kvtransit.wire.limits import DEFAULT_READ_SIZE

Part = bytes | bytearray | memoryview
"""One piece of an encoded frame, as `Connection.send_parts` returns it and `Endpoint.write_parts` takes it."""


class SansIOConnection(Protocol):
    """The surface of kvtransit.wire.connection.Connection this package (and the agents) rely on."""

    def send_parts(self, event: Any) -> Sequence[Part]: ...
    def kv_end(self, request_id: int) -> KvEnd: ...
    def receive_data(self, data: bytes) -> None: ...
    def next_event(self) -> Any: ...
    def get_buffer(self, sizehint: int) -> memoryview: ...
    def buffer_updated(self, nbytes: int) -> None: ...


ConnectionFactory = Callable[[Role, Role], SansIOConnection]


def wire_connection(our_role: Role, their_role: Role) -> SansIOConnection:
    """The real sans-IO connection (kvtransit.wire)."""
    return Connection(our_role=our_role, their_role=their_role)


@dataclass(frozen=True)
class FlowLimits:
    """Buffer bounds of one endpoint. Memory per connection stays within about
    read_high_bytes + one frame (wire MAX_PAYLOAD) + write_high_bytes + one send."""

    # Sends wait (drain) above this many bytes queued in the transport, and resume below low.
    # 4 MiB / 1 MiB: a few loopback socket buffers, so the kernel never runs dry between wake-ups.
    write_high_bytes: int = 4 * 1024 * 1024
    write_low_bytes: int = 1 * 1024 * 1024
    # Stop reading when this many received bytes wait for a consumer that is busy elsewhere.
    read_high_bytes: int = 8 * 1024 * 1024
    # What each socket read offers to fill (the wire's own default: a few socket buffers).
    read_size: int = DEFAULT_READ_SIZE

    def __post_init__(self) -> None:
        for name in ("write_high_bytes", "read_high_bytes", "read_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"FlowLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.write_low_bytes <= self.write_high_bytes:
            raise ValueError(
                f"FlowLimits.write_low_bytes must be in 0..write_high_bytes ({self.write_high_bytes}), "
                f"got {self.write_low_bytes!r}"
            )


DEFAULT_LIMITS = FlowLimits()
"""The bounds every endpoint gets unless its caller passes its own."""


def is_borrowed(part: Part) -> bool:
    """True when `part` is memory its owner may reuse (a transport holding a view of it is unsafe)."""
    if isinstance(part, bytes):
        return False
    if isinstance(part, memoryview):
        return not isinstance(part.obj, bytes)
    return True


class FramedProtocol(asyncio.BufferedProtocol):
    """The transport's callbacks for one connection, and the waits `Endpoint` builds on.

    `on_made(protocol)` runs once the transport is attached (a Server uses it to start the handler)."""

    def __init__(self, connection: SansIOConnection, limits: FlowLimits,
                 on_made: Callable[[FramedProtocol], None] | None = None):
        self.connection = connection
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self._on_made = on_made
        self._loop = asyncio.get_running_loop()
        self._unclaimed_bytes = 0  # received since the consumer last found the buffer empty
        self._reading_paused = False
        self._data_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain_waiters: deque[asyncio.Future[None]] = deque()
        self.eof = False
        self.lost = self._loop.create_future()  # result: the exception connection_lost got (or None)

    # -- transport callbacks --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Typed BaseTransport by asyncio; a stream connection is always handed one with the full Transport
        # surface, but uvloop's transports are not asyncio.Transport subclasses, so no isinstance check.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=self.limits.write_high_bytes, low=self.limits.write_low_bytes)
        sock = transport.get_extra_info("socket")
        keep_alive(sock)
        use_congestion_control(sock, LINK_CONGESTION_CONTROL)
        if self._on_made is not None:
            self._on_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        # The wire offers its whole free tail (it may be many MiB after a big frame). Offer the transport
        # at most read_size of it per read, so the read high-water check runs between reads of bounded size
        # and the buffer does not double again just because one read filled it. The wire still makes
        # room for the rest of the frame in progress, so large payloads are received in place.
        return self.connection.get_buffer(max(sizehint, self.limits.read_size))[:self.limits.read_size]

    def buffer_updated(self, nbytes: int) -> None:
        self.connection.buffer_updated(nbytes)
        self._unclaimed_bytes += nbytes
        if self._data_waiter is not None:
            self._wake_reader()
        elif self._unclaimed_bytes > self.limits.read_high_bytes:
            self.pause_reading()

    def eof_received(self) -> bool:
        self._feed_eof()
        return True  # half-close: we may still send (an Error, a Bye) before closing our side

    def connection_lost(self, exc: Exception | None) -> None:
        self._feed_eof()
        if not self.lost.done():
            self.lost.set_result(exc)
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("connection lost while waiting to send"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    # -- what Endpoint awaits and calls ---------------------------------------------------------

    @property
    def is_lost(self) -> bool:
        """True once connection_lost ran: nothing more will be read or written."""
        return self.lost.done()

    def _feed_eof(self) -> None:
        if not self.eof:
            self.eof = True
            self.connection.receive_data(b"")
            self._wake_reader()

    def _wake_reader(self) -> None:
        waiter, self._data_waiter = self._data_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_for_data(self) -> None:
        self._data_waiter = self._loop.create_future()
        try:
            await self._data_waiter
        finally:
            self._data_waiter = None

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.transport.is_closing():
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        self._unclaimed_bytes = 0
        if self._reading_paused:
            self._reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    async def drain(self, *, until_empty: bool) -> None:
        transport = self.transport
        assert transport is not None
        if until_empty and transport.get_write_buffer_size() > 0 and not self.lost.done():
            # No callback fires at "empty" under ordinary limits; with high=low=0 the transport pauses
            # us now and resumes us exactly when its buffer is empty.
            transport.set_write_buffer_limits(high=0, low=0)
            try:
                await self._wait_resumed()
            finally:
                if not transport.is_closing():
                    transport.set_write_buffer_limits(high=self.limits.write_high_bytes,
                                                      low=self.limits.write_low_bytes)
        elif self._write_paused:
            await self._wait_resumed()

    async def _wait_resumed(self) -> None:
        if self.lost.done():
            raise ConnectionResetError("connection lost while waiting to send")
        if not self._write_paused:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter
