"""The in-memory transport: two endpoints joined without a socket, with TCP's flow control and close semantics.

Tests and the conformance suite run every Endpoint behaviour over it as well as over TCP; `Server`
(server.py) accepts over it too (`serve_memory`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any

from kvtransit.runtime.transport.endpoint import Endpoint
from kvtransit.runtime.transport.protocol import (
    DEFAULT_LIMITS,
    ConnectionFactory,
    FlowLimits,
    FramedProtocol,
    Part,
    wire_connection,
)
from kvtransit.wire.events import Role


class MemoryTransport(asyncio.Transport):
    """One direction-pair end of an in-memory byte stream, with TCP's flow control and close semantics.

    Like uvloop it keeps views of what it is given until the peer has read them, so the endpoint's
    buffer-ownership rule is exercised here too. Delivery goes through the loop (call_soon), never
    synchronously inside write(), as with a socket.
    """

    # Bytes handed to the peer per loop iteration, so one busy pair cannot starve the loop.
    DELIVER_PER_TURN = 4 * 1024 * 1024

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: FramedProtocol, name: str):
        super().__init__()
        self._loop = loop
        self._protocol = protocol
        self._name = name
        self.peer: MemoryTransport | None = None
        self._pending: deque[memoryview] = deque()
        self._pending_bytes = 0
        # asyncio's own defaults (selector transports: high 64 KiB, low = high / 4); FramedProtocol sets its
        # FlowLimits at connection_made, as it does on a socket.
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



_memory_ids = iter(range(1, 1 << 62))


def memory_pipe(a: FramedProtocol, b: FramedProtocol) -> None:
    """Join two protocols in memory and tell each its transport is made (needs a running loop)."""
    loop = asyncio.get_running_loop()
    name = f"mem{next(_memory_ids)}"
    ta = MemoryTransport(loop, a, f"{name}/a")
    tb = MemoryTransport(loop, b, f"{name}/b")
    ta.peer, tb.peer = tb, ta
    a.connection_made(ta)
    b.connection_made(tb)


def memory_pair(a_role: Role, b_role: Role, *, limits: FlowLimits = DEFAULT_LIMITS,
                connection_factory: ConnectionFactory = wire_connection) -> tuple[Endpoint, Endpoint]:
    """Two endpoints joined in memory (a speaks as a_role to b, b as b_role to a). Needs a running loop."""
    a = FramedProtocol(connection_factory(a_role, b_role), limits)
    b = FramedProtocol(connection_factory(b_role, a_role), limits)
    memory_pipe(a, b)
    return Endpoint(a), Endpoint(b)
