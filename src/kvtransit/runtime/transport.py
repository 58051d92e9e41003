"""Join a sans-IO wire Connection to a byte stream: TCP sockets or an in-memory pair.

`_FramedProtocol` is an asyncio.BufferedProtocol that lets the transport read straight into the
connection's receive buffer (`get_buffer` / `buffer_updated`: no copy on the way in). `Endpoint` is what
agents use: `send(event)`, `next_event()`, `close()`, `wait_closed()`. The same Endpoint runs over TCP
(`open_endpoint`, `serve`) and over `memory_pair` / `serve_memory`, so one conformance suite covers both.

Buffer ownership, the two rules this module exists to keep:
- A received payload is a memoryview into the connection's receive buffer, valid until the next
  receive. So while an event with a payload view is out with the caller, reading is paused; the caller
  releases it by calling `next_event()` again (copy the payload to keep it longer).
- uvloop (and our memory transport) keep a *view* of what is passed to `transport.write` until it is
  written. So a send whose parts borrow memory someone may reuse (anything but `bytes`) waits until the
  transport's write buffer is empty before returning.

Flow control: sends wait while the transport's write buffer is above `write_high_bytes`; reading pauses
when more than `read_high_bytes` have arrived that the consumer has not asked for yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvtransit.wire import Connection, State
from kvtransit.wire.errors import ErrorCode, ProtocolError, RemoteProtocolError
from kvtransit.wire.events import NEED_DATA, ConnectionClosed, Error, Role
from kvtransit.wire.limits import DEFAULT_READ_SIZE, MAX_MESSAGE

log = logging.getLogger(__name__)

Part = bytes | bytearray | memoryview


class SansIOConnection(Protocol):
    """The surface of kvtransit.wire.connection.Connection this module relies on."""

    def send_parts(self, event: Any) -> list[Part]: ...
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


def _borrowed(part: Part) -> bool:
    """True when `part` is memory its owner may reuse (a transport holding a view of it is unsafe)."""
    if isinstance(part, bytes):
        return False
    if isinstance(part, memoryview):
        return not isinstance(part.obj, bytes)
    return True


def _has_payload_view(event: Any) -> bool:
    return isinstance(getattr(event, "payload", None), memoryview)


# A silent peer (a host or link gone without a FIN or RST) is found by TCP itself, on every kvtransit TCP
# connection: keepalive probes after KEEPALIVE_IDLE_S of silence, KEEPALIVE_INTERVAL_S apart, KEEPALIVE_PROBES
# of them (dead after ~8 s idle); and TCP_USER_TIMEOUT drops a connection whose sent data stays unacknowledged
# for USER_TIMEOUT_S. Both are above the chaos suite's 2 s link outage, which TCP rides out by retransmitting.
KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_PROBES = 3
USER_TIMEOUT_S = 10


def _keep_alive(sock: Any) -> None:
    """Turn on TCP keepalive and the user timeout on a TCP socket (anything else, e.g. in memory: nothing)."""
    import socket

    if sock is None or getattr(sock, "type", None) != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                                                  socket.AF_INET6):
        return
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES), ("TCP_USER_TIMEOUT", USER_TIMEOUT_S * 1000)):
        if hasattr(socket, name):  # Linux has all four; elsewhere keepalive alone, with the OS's timers
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, option, value)


class _FramedProtocol(asyncio.BufferedProtocol):
    def __init__(self, connection: SansIOConnection, limits: FlowLimits,
                 on_made: Callable[[_FramedProtocol], None] | None = None):
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
        self.transport = transport  # type: ignore[assignment]  (uvloop's are not asyncio.Transport subclasses)
        transport.set_write_buffer_limits(high=self.limits.write_high_bytes, low=self.limits.write_low_bytes)
        _keep_alive(transport.get_extra_info("socket"))
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

    # -- helpers for Endpoint -------------------------------------------------------------------

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


class Endpoint:
    """One end of a framed connection: send events, receive events, close."""

    def __init__(self, protocol: _FramedProtocol):
        self._protocol = protocol
        self._send_lock = asyncio.Lock()
        self._lent_view: memoryview | None = None

    @property
    def connection(self) -> SansIOConnection:
        return self._protocol.connection

    @property
    def transport(self) -> asyncio.Transport:
        assert self._protocol.transport is not None
        return self._protocol.transport

    @property
    def peername(self) -> Any:
        return self.transport.get_extra_info("peername")

    @property
    def is_closing(self) -> bool:
        return self.transport.is_closing() or self._protocol.lost.done()

    # -- sending --------------------------------------------------------------------------------

    async def send(self, event: Any) -> None:
        """Encode `event` and write it; waits while the peer is not keeping up (flow control).

        Returns once the transport no longer needs the event's memory (see module docstring)."""
        async with self._send_lock:
            await self.write_parts(self.connection.send_parts(event))

    @contextlib.asynccontextmanager
    async def exclusive(self):
        """Hold the send side for a sequence of raw writes (the egress shaper writes frames in slices)."""
        async with self._send_lock:
            yield self

    async def write_parts(self, parts: Sequence[Part]) -> None:
        """Write already-encoded bytes. Callers other than `send` must hold `exclusive()`."""
        if self.is_closing:
            raise ConnectionResetError(f"cannot send on a closed connection (peer {self.peername})")
        self.transport.writelines(parts)
        await self._protocol.drain(until_empty=any(_borrowed(p) for p in parts))

    # -- receiving ------------------------------------------------------------------------------

    async def next_event(self) -> Any | None:
        """The next event from the peer, or None once the peer has closed cleanly (EOF at a frame
        boundary, or the call after its Bye: nothing may follow a Bye, so there is no point waiting).

        Raises RemoteProtocolError when the peer sent something the protocol forbids (including EOF
        in the middle of a frame). An event's payload view is valid until the next call."""
        protocol = self._protocol
        self._take_back_view()
        if getattr(self.connection, "their_state", None) is State.CLOSED:
            return None
        while True:
            event = self.connection.next_event()
            if event is NEED_DATA:
                if protocol.eof:
                    return None  # the connection should have said ConnectionClosed; do not hang
                protocol.resume_reading()
                await protocol.wait_for_data()
                continue
            if isinstance(event, ConnectionClosed):
                return None
            if _has_payload_view(event):
                self._lent_view = event.payload
                protocol.pause_reading()
            return event

    def _take_back_view(self) -> None:
        """End the loan of the last payload view, as the contract says.

        The caller usually still references the previous event (an `async for` variable is rebound only
        after this call returns); releasing the view lets the wire reuse its receive buffer instead of
        allocating a fresh one per frame (measured: a third of the relay's time at 1 MiB frames). A caller
        that kept the view anyway gets a ValueError on use instead of silently reading newer bytes.
        A transport still holding a slice of it keeps the buffer exported, so the wire still sees that."""
        view, self._lent_view = self._lent_view, None
        if view is not None:
            with contextlib.suppress(BufferError):  # exported right now (e.g. mid-copy): leave it be
                view.release()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Any:
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        return event

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close after what is already queued has been written."""
        if self._protocol.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping anything unwritten."""
        if self._protocol.transport is not None:
            self.transport.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._protocol.lost)

    async def aclose(self) -> None:
        self.close()
        await self.wait_closed()

    async def send_error(self, exc: ProtocolError | BaseException, *, timeout_s: float = 1.0) -> bool:
        """Best effort: tell the peer what went wrong in an Error frame. True when it was written."""
        code = exc.code if isinstance(exc, ProtocolError) else ErrorCode.INTERNAL
        message = str(exc).encode()[:MAX_MESSAGE].decode(errors="ignore") or type(exc).__name__
        try:
            await asyncio.wait_for(self.send(Error(code=code, message=message)), timeout_s)
        except (ProtocolError, ConnectionError, asyncio.TimeoutError, RuntimeError) as send_exc:
            log.debug("could not send Error frame to %s: %s", self.peername, send_exc)
            return False
        return True


# -- in-memory transport ----------------------------------------------------------------------------


class _MemoryTransport(asyncio.Transport):
    """One direction-pair end of an in-memory byte stream, with TCP's flow control and close semantics.

    Like uvloop it keeps views of what it is given until the peer has read them, so the endpoint's
    buffer-ownership rule is exercised here too. Delivery goes through the loop (call_soon), never
    synchronously inside write(), as with a socket.
    """

    # Bytes handed to the peer per loop iteration, so one busy pair cannot starve the loop.
    DELIVER_PER_TURN = 4 * 1024 * 1024

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: _FramedProtocol, name: str):
        super().__init__()
        self._loop = loop
        self._protocol = protocol
        self._name = name
        self.peer: _MemoryTransport | None = None
        self._pending: deque[memoryview] = deque()
        self._pending_bytes = 0
        self._high, self._low = 64 * 1024, 16 * 1024
        self._write_paused = False
        self._reading = True
        self._closing = False
        self._eof_sent = False
        self._lost = False
        self._flush_scheduled = False

    # transport surface
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("memory", self.peer._name if self.peer else None),
                "sockname": ("memory", self._name)}.get(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def is_reading(self) -> bool:
        return self._reading and not self._lost

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            if self.peer is not None:
                self.peer._schedule_flush()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause_writing()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return self._pending_bytes

    def write(self, data: Part) -> None:
        if self._closing or self._lost:
            raise RuntimeError(f"write on a closed memory transport ({self._name})")
        view = memoryview(data).cast("B")
        if not len(view):
            return
        self._pending.append(view)
        self._pending_bytes += len(view)
        self._schedule_flush()
        self._maybe_pause_writing()

    def writelines(self, list_of_data: Iterable[Part]) -> None:
        for data in list_of_data:
            self.write(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self._closing = True
        self._schedule_flush()

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._schedule_flush()  # deliver what is queued, then EOF, then connection_lost

    def abort(self) -> None:
        self._closing = True
        self._drop_pending()
        self._lose(None)
        if self.peer is not None and not self.peer._lost:
            self.peer._drop_pending()
            self.peer._lose(ConnectionResetError(f"connection reset by peer ({self._name})"))

    # internals
    def _maybe_pause_writing(self) -> None:
        if not self._write_paused and self._pending_bytes > self._high and not self._lost:
            self._write_paused = True
            self._protocol.pause_writing()

    def _maybe_resume_writing(self) -> None:
        if self._write_paused and self._pending_bytes <= self._low and not self._lost:
            self._write_paused = False
            self._protocol.resume_writing()

    def _drop_pending(self) -> None:
        self._pending.clear()
        self._pending_bytes = 0

    def _lose(self, exc: Exception | None) -> None:
        if not self._lost:
            self._lost = True
            self._closing = True
            self._loop.call_soon(self._protocol.connection_lost, exc)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        peer = self.peer
        if self._lost or peer is None:
            return
        if peer._lost:  # the peer is gone: nothing we send can arrive (TCP would answer with a reset)
            self._drop_pending()
            self._lose(ConnectionResetError(f"connection reset by peer ({peer._name})"))
            return
        budget = self.DELIVER_PER_TURN
        receiver = peer._protocol
        while self._pending and peer._reading and budget > 0:
            head = self._pending[0]
            buf = receiver.get_buffer(len(head))
            n = min(len(buf), len(head), budget)
            buf[:n] = head[:n]
            if n == len(head):
                self._pending.popleft()
            else:
                self._pending[0] = head[n:]
            self._pending_bytes -= n
            budget -= n
            receiver.buffer_updated(n)
        self._maybe_resume_writing()
        if self._pending:
            if peer._reading:
                self._schedule_flush()  # out of budget this turn; resume_reading reschedules otherwise
            return
        if self._closing and not self._eof_sent:
            self._eof_sent = True
            keep_open = receiver.eof_received()
            if not keep_open:
                peer.close()
            self._lose(None)


def _memory_pipe(loop: asyncio.AbstractEventLoop, a: _FramedProtocol, b: _FramedProtocol,
                 name: str) -> None:
    ta = _MemoryTransport(loop, a, f"{name}/a")
    tb = _MemoryTransport(loop, b, f"{name}/b")
    ta.peer, tb.peer = tb, ta
    a.connection_made(ta)
    b.connection_made(tb)


_memory_ids = iter(range(1, 1 << 62))


def memory_pair(a_role: Role, b_role: Role, *, limits: FlowLimits = FlowLimits(),
                connection_factory: ConnectionFactory = wire_connection) -> tuple[Endpoint, Endpoint]:
    """Two endpoints joined in memory (a speaks as a_role to b, b as b_role to a). Needs a running loop."""
    loop = asyncio.get_running_loop()
    a = _FramedProtocol(connection_factory(a_role, b_role), limits)
    b = _FramedProtocol(connection_factory(b_role, a_role), limits)
    _memory_pipe(loop, a, b, f"mem{next(_memory_ids)}")
    return Endpoint(a), Endpoint(b)


# -- TCP ---------------------------------------------------------------------------------------------


async def open_endpoint(host: str, port: int, our_role: Role, their_role: Role, *,
                        limits: FlowLimits = FlowLimits(),
                        connection_factory: ConnectionFactory = wire_connection) -> Endpoint:
    """Connect to a kvtransit peer over TCP."""
    loop = asyncio.get_running_loop()
    try:
        _, protocol = await loop.create_connection(
            lambda: _FramedProtocol(connection_factory(our_role, their_role), limits), host, port)
    except OSError as exc:
        raise ConnectionError(f"cannot connect to {their_role.name.lower()} at {host}:{port}: "
                              f"{exc.strerror or exc}") from exc
    return Endpoint(protocol)


Handler = Callable[[Endpoint], Awaitable[None]]


class Server:
    """Accepts connections and runs `handler(endpoint)` for each, isolating failures per connection.

    A RemoteProtocolError (or any exception) in one handler sends an Error frame if it can and closes
    that connection only. `shutdown(deadline_s)` stops accepting, lets handlers finish until the
    deadline, then cancels the rest (uvicorn's order).
    """

    def __init__(self, handler: Handler, our_role: Role, their_role: Role, limits: FlowLimits,
                 connection_factory: ConnectionFactory):
        self._handler = handler
        self.our_role, self.their_role = our_role, their_role
        self.limits = limits
        self._connection_factory = connection_factory
        self._listener: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._endpoints: set[Endpoint] = set()
        self._accepting = True
        self.host: str = "memory"
        self.port: int = 0
        self.connections_failed = 0

    # accepting
    def _protocol_factory(self) -> _FramedProtocol:
        return _FramedProtocol(self._connection_factory(self.our_role, self.their_role), self.limits,
                               on_made=self._on_connection)

    def _on_connection(self, protocol: _FramedProtocol) -> None:
        endpoint = Endpoint(protocol)
        if not self._accepting:
            endpoint.abort()
            return
        self._endpoints.add(endpoint)
        task = asyncio.get_running_loop().create_task(self._run(endpoint), name=f"handler {endpoint.peername}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, endpoint: Endpoint) -> None:
        failed = False
        try:
            await self._handler(endpoint)
        except RemoteProtocolError as exc:
            failed = True
            log.warning("peer %s broke the protocol: %s", endpoint.peername, exc)
            await endpoint.send_error(exc)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            failed = True
            log.info("connection %s lost: %s", endpoint.peername, exc)
        except asyncio.CancelledError:
            failed = True
            raise
        except Exception as exc:
            failed = True
            log.exception("handler for %s failed", endpoint.peername)
            await endpoint.send_error(exc)
        finally:
            if failed:
                self.connections_failed += 1
            endpoint.close()
            self._endpoints.discard(endpoint)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(endpoint.wait_closed(), 1.0)
            if not endpoint._protocol.lost.done():
                endpoint.abort()

    @property
    def active_connections(self) -> int:
        return len(self._tasks)

    async def connect(self, our_role: Role | None = None, their_role: Role | None = None, *,
                      limits: FlowLimits | None = None) -> Endpoint:
        """A client endpoint connected to this server (TCP to its own address, or in memory)."""
        our_role = self.their_role if our_role is None else our_role
        their_role = self.our_role if their_role is None else their_role
        limits = self.limits if limits is None else limits
        if self._listener is not None:
            return await open_endpoint(self.host, self.port, our_role, their_role, limits=limits,
                                       connection_factory=self._connection_factory)
        if not self._accepting:
            raise ConnectionRefusedError("memory server is shut down")
        client = _FramedProtocol(self._connection_factory(our_role, their_role), limits)
        _memory_pipe(asyncio.get_running_loop(), client, self._protocol_factory(), f"mem{next(_memory_ids)}")
        return Endpoint(client)

    async def shutdown(self, deadline_s: float = 5.0) -> None:
        """Stop accepting; wait up to `deadline_s` for handlers to finish; cancel the rest."""
        self._accepting = False
        if self._listener is not None:
            self._listener.close()
        if self._tasks:
            _, still_running = await asyncio.wait(set(self._tasks), timeout=deadline_s)
            for task in still_running:
                task.cancel()
            if still_running:
                log.info("shutdown deadline (%.1f s) passed: cancelled %d handler(s)", deadline_s,
                         len(still_running))
                await asyncio.wait(still_running)
        for endpoint in list(self._endpoints):
            endpoint.abort()
        if self._listener is not None:
            await self._listener.wait_closed()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()


async def serve(host: str, port: int, handler: Handler, our_role: Role, their_role: Role, *,
                limits: FlowLimits = FlowLimits(),
                connection_factory: ConnectionFactory = wire_connection) -> Server:
    """Listen on host:port (port 0: any free port, see `server.port`) and run handler per connection."""
    server = Server(handler, our_role, their_role, limits, connection_factory)
    loop = asyncio.get_running_loop()
    try:
        server._listener = await loop.create_server(server._protocol_factory, host, port)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port} for {their_role.name.lower()} "
                                 f"connections: {exc.strerror or exc}") from exc
    sockname = server._listener.sockets[0].getsockname()
    server.host, server.port = sockname[0], sockname[1]
    return server


def serve_memory(handler: Handler, our_role: Role, their_role: Role, *, limits: FlowLimits = FlowLimits(),
                 connection_factory: ConnectionFactory = wire_connection) -> Server:
    """A Server reached with `await server.connect()` over in-memory pairs (tests, conformance)."""
    return Server(handler, our_role, their_role, limits, connection_factory)


# -- signals -------------------------------------------------------------------------------------------


class Shutdown:
    """SIGINT/SIGTERM → `requested`; a second signal → `forced` too (stop waiting for the drain).

    Use as a context manager inside the running loop; the previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.forced = asyncio.Event()
        self.reason = ""
        self._installed: list[signal.Signals] = []

    def request(self, reason: str = "requested") -> None:
        if self.requested.is_set():
            self.forced.set()
        else:
            self.reason = reason
            self.requested.set()

    async def wait(self) -> str:
        await self.requested.wait()
        return self.reason

    def __enter__(self) -> Shutdown:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self.request, sig.name)
            self._installed.append(sig)
        return self

    def __exit__(self, *exc_info: object) -> None:
        loop = asyncio.get_running_loop()
        while self._installed:
            loop.remove_signal_handler(self._installed.pop())
