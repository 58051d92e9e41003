"""`Endpoint`: what agents use to talk over one connection: send events, receive events, close.

The same Endpoint runs over TCP (tcp.py, server.py) and over in-memory pairs (memory.py); it drives a
`FramedProtocol` (protocol.py) and the sans-IO wire Connection inside it.

Buffer ownership, the two rules this module exists to keep:
- A received payload is a memoryview into the connection's receive buffer, valid until the next
  receive. So while an event with a payload view is out with the caller, reading is paused; the caller
  releases it by calling `next_event()` again (copy the payload to keep it longer).
- uvloop (and our memory transport) keep a *view* of what is passed to `transport.write` until it is
  written. So a send whose parts borrow memory someone may reuse (anything but `bytes`) waits until the
  transport's write buffer is empty before returning.

Flow control: sends wait while the transport's write buffer is above `FlowLimits.write_high_bytes`;
reading pauses when more than `read_high_bytes` have arrived that the consumer has not asked for yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from kvtransit.runtime.tasks import GOODBYE_TIMEOUT_S
from kvtransit.runtime.transport.protocol import FramedProtocol, Part, SansIOConnection, is_borrowed
from kvtransit.wire import State
from kvtransit.wire.errors import ErrorCode, ProtocolError
from kvtransit.wire.events import NEED_DATA, Bye, ConnectionClosed, Error
from kvtransit.wire.limits import clip_message, clip_reason

log = logging.getLogger(__name__)


def _has_payload_view(event: Any) -> bool:
    return isinstance(getattr(event, "payload", None), memoryview)


class Endpoint:
    """One end of a framed connection: send events, receive events, close.

    Made by `open_endpoint`, `memory_pair` and a Server's accept. Wrapping the send side (the middlebox's
    fault chain does): a subclass built from a live endpoint, `super().__init__(endpoint)`, takes that
    endpoint's connection over (same socket, same sans-IO connection; use only the new object from then
    on) and overrides one or both of the two points every send passes: `connection` (what `send` encodes
    with, and what callers that encode frames themselves use) and `write_parts` (every write).
    """

    def __init__(self, source: FramedProtocol | Endpoint):
        self._protocol: FramedProtocol = source._protocol if isinstance(source, Endpoint) else source
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
        """True once either side began to close: no more sends."""
        return self.transport.is_closing() or self._protocol.is_lost

    @property
    def is_closed(self) -> bool:
        """True once the connection is gone (the transport reported it lost): `wait_closed()` returns."""
        return self._protocol.is_lost

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
        await self._protocol.drain(until_empty=any(is_borrowed(p) for p in parts))

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

    async def goodbye(self, reason: str, *, timeout_s: float = GOODBYE_TIMEOUT_S) -> bool:
        """Best effort on the way out: a Bye with `reason` (clipped to the wire's limit). True when it was written.

        A peer that cannot take a few bytes within `timeout_s` is gone, and a stop must not wait on it."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.send(Bye(reason=clip_reason(reason)))
        except (ProtocolError, ConnectionError, TimeoutError, RuntimeError) as exc:
            log.debug("could not say goodbye to %s: %s", self.peername, exc)
            return False
        return True

    async def send_error(self, exc: ProtocolError | BaseException, *, timeout_s: float = 1.0) -> bool:
        """Best effort: tell the peer what went wrong in an Error frame. True when it was written."""
        code = exc.code if isinstance(exc, ProtocolError) else ErrorCode.INTERNAL
        message = clip_message(str(exc)) or type(exc).__name__
        try:
            async with asyncio.timeout(timeout_s):
                await self.send(Error(code=code, message=message))
        except (ProtocolError, ConnectionError, TimeoutError, RuntimeError) as send_exc:
            log.debug("could not send Error frame to %s: %s", self.peername, send_exc)
            return False
        return True
