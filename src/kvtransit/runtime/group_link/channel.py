"""One TCP connection between two collective endpoints (rank ↔ rank, rank ↔ switch), its send side shaped as
the scale-up link.

The send side is the user-space link the middlebox's egress uses (shaping/userspace.py): a token bucket at the
link's rate with no burst, then a delay line of the link's latency. A frame is written at once and stamped with
`due_ns`, when it is due at the far end on the modelled link; the receiver holds it until then
(`receive_due`). So real socket time overlaps the modelled time instead of adding to it, and a frame that
arrives after its due time is late by exactly what the host could not keep up with (counted in `late_ns`).

Failures are named, never hung: EOF, a broken frame or silence past a deadline raise `PeerGone` with the peer's
name; every connection gets the same keepalive and TCP_USER_TIMEOUT as the rest of kvtransit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from kvtransit.runtime.clock import Clock
from kvtransit.runtime.transport.tcp_options import keep_alive
from kvtransit.shaping.userspace import DelayLine, TokenBucket
from kvtransit.wire.group import CollectiveFrameError, Frame, FrameReader, Kind, encode

READ_SIZE = 1 << 20
# Drain the socket's write buffer past this many bytes (asyncio's default high-water mark is 64 KiB; a
# per-step all-reduce of a prefill can be tens of MB).
DRAIN_ABOVE_BYTES = 1 << 22


class GroupMember(Protocol):
    """Who a process is in its group, as JOIN says it and checks its peer's (a TP rank's RankPlan, a ring attention
    rank's plan)."""

    @property
    def group(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def deadline_s(self) -> float: ...


class PeerGone(Exception):
    """The peer closed, broke the framing, or said nothing within the deadline; the message says which."""


class PeerSilent(PeerGone):
    """The peer said nothing within the deadline (it may still be there: a serving group idles between steps)."""


class Channel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, clock: Clock, *,
                 rate_Bps: float, latency_s: float, peer: str):
        self.peer = peer
        self.clock = clock
        self._reader = reader
        self._writer = writer
        self._bucket = TokenBucket(rate_Bps, 0)
        self._delay = DelayLine(latency_s)
        self._frames: asyncio.Queue[Frame | BaseException | None] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._read(), name=f"read {peer}")
        self.late_ns = 0  # Σ how late frames arrived after their due time (the host's share)
        self.bytes_sent = 0
        keep_alive(writer.get_extra_info("socket"))

    async def _read(self) -> None:
        frames = FrameReader()
        try:
            while True:
                data = await self._reader.read(READ_SIZE)
                if not data:
                    self._frames.put_nowait(None if frames.buffered == 0 else
                                            PeerGone(f"{self.peer} stopped mid-frame"))
                    return
                for frame in frames.feed(data):
                    self._frames.put_nowait(frame)
        except (CollectiveFrameError, OSError) as exc:
            self._frames.put_nowait(PeerGone(f"{self.peer}: {exc}"))

    async def send(self, frame: Frame, *, shaped: bool = True, at_ns: int | None = None,
                   occupy_bytes: int | None = None, added_latency_s: float = 0.0, due_ns: int | None = None) -> int:
        """Write `frame` now, stamped with its due time on the modelled link (unshaped: due now).

        `at_ns`: when the frame leaves in model time (the due time of what it answers), if the sender knows it:
        its due time is then counted from there, not from whenever the host got round to sending it, so a late
        wake-up is not carried into every later hop (absolute deadlines, as DeadlineSchedule holds steps).
        `occupy_bytes`: how many bytes' time the frame holds the link for, when a module on the link is slower
        than its wire bytes (docs/reference.md §5: max(wire, ops / budget)); `added_latency_s`: the module's latency.
        `due_ns`: already stamped on a link shared with another flow (the middlebox's decode link); sent as is."""
        now_ns = self.clock.now_ns()
        nbytes = memoryview(frame.payload).nbytes
        if due_ns is not None:
            pass
        elif shaped:
            on_wire = self._bucket.reserve(nbytes if occupy_bytes is None else occupy_bytes,
                                           (now_ns if at_ns is None else at_ns) / 1e9)
            due_ns = round((self._delay.release_time(on_wire) + added_latency_s) * 1e9)
        else:
            due_ns = now_ns
        header, payload = encode(replace(frame, due_ns=due_ns))
        try:
            self._writer.writelines((header, payload))
            self.bytes_sent += nbytes
            if self._writer.transport.get_write_buffer_size() > DRAIN_ABOVE_BYTES:
                await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise PeerGone(f"{self.peer}: {exc}") from exc
        return due_ns

    async def receive(self, timeout_s: float, what: str) -> Frame:
        """The next frame, or PeerGone naming the peer and `what` was awaited (EOF, bad bytes, deadline)."""
        try:
            # A failure deadline, not model time: it bounds how long a dead peer can hold the group.
            async with asyncio.timeout(timeout_s):
                item = await self._frames.get()
        except TimeoutError:
            raise PeerSilent(f"no frame from {self.peer} within {timeout_s:g} s, waiting for {what}") from None
        if item is None:
            self._frames.put_nowait(None)  # EOF stays EOF for the next reader
            raise PeerGone(f"{self.peer} closed its connection, waiting for {what}")
        if isinstance(item, BaseException):
            self._frames.put_nowait(item)
            raise PeerGone(f"{item}, waiting for {what}")
        return item

    async def receive_or_fail(self, timeout_s: float, what: str, failed: Callable[[str], Exception],
                              who: str) -> Frame:
        """The next frame, a group's failure raised as `failed(reason)`: the peer gone or silent ("`who` found:
        ..."), or the ABORT a peer sent (its reason, which every member then reports)."""
        try:
            frame = await self.receive(timeout_s, what)
        except PeerGone as exc:
            raise failed(f"{who} found: {exc}") from None
        if frame.kind is Kind.ABORT:
            raise failed(frame.reason)
        return frame

    async def hold_until_due(self, frame: Frame) -> None:
        """Hold `frame` until its due time on the modelled link; count how late it came if it came late."""
        now = self.clock.now_ns()
        if now > frame.due_ns:
            self.late_ns += now - frame.due_ns
            return
        await self.clock.sleep_until(frame.due_ns)

    async def send_quietly(self, frame: Frame) -> None:
        """Best effort (an ABORT to a peer that may be gone)."""
        with contextlib.suppress(PeerGone, CollectiveFrameError):
            await self.send(frame, shaped=False)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()
