"""The middlebox's user-space egress shaper: a FIFO of hand-offs over a link of `channels` lanes.

Each hand-off (a `Transfer`) waits its turn for a channel, in the order it asked (docs/reference.md §4: one shared
FIFO link, 1 channel by default; each channel carries one hand-off at the full link rate, as in the
simulator). Its frames are cut into slices; each slice is paced by the channel's TokenBucket (its
serialisation ends at reserve()) and released by the channel's DelayLine one link latency later. A writer
task puts each slice on the downstream socket when it is due, so the receiver sees bytes arrive smoothly
at the link rate, not in frame-sized bursts.

Slices carry the time they became ready (toxiproxy's latency toxic): deadlines are absolute, computed
from that time, so time the middlebox spent elsewhere is not added again; the delay stage holds only
what is still owed. The producer (`Transfer.send`) is held back at the link rate, a little ahead of the
serialiser (`lead_bytes`), so memory stays at about one bandwidth-delay product plus the lead.

A transfer holds its downstream endpoint exclusively while it runs (frames cannot interleave mid-frame
on one socket); concurrent channels overlap when their transfers go to different endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.runtime.transport import Endpoint, Part, is_borrowed
from kvtransit.shaping.userspace import DelayLine, TokenBucket

# 256 KiB slices: at 50 MB/s one slice is 5 ms of link time, at 3.125 GB/s (eth-25g) 84 µs, so pacing
# is smooth at the timer resolution we can hold (≈ 1 µs with the clock's spin, see clock.py).
DEFAULT_SLICE_BYTES = 256 * 1024
# The producer may run this far ahead of the serialiser: two slices, and at least MIN_LEAD_S of link
# time. If the producer wakes later than its lead (event-loop timers are ms-grained, and a busy 2-core box
# adds more), the link goes idle and that time is lost for good; measured at 400 MB/s on loopback, a
# 1.3 ms lead lost 3-8 % of the link, a 4 ms lead under 1 %. Memory: rate x lead (1.6 MB at 400 MB/s).
DEFAULT_LEAD_SLICES = 2
MIN_LEAD_S = 0.004
# Stamped frames (another flow's, `EgressShaper.stamp`) remembered to count the ones inside each transfer's time: a
# step's few legs, over the few steps a hand-off lasts, with room to spare.
STAMPED_SPANS = 1024


@dataclass
class TransferRecord:
    """What one hand-off did on the link (times are clock ns)."""

    label: str
    channel: int = -1
    queued_ns: int = 0
    started_ns: int | None = None  # when it got its channel
    # When its first frame was ready to go (the first `Transfer.send`'s ready_ns; None: when it was queued): a
    # hand-off may get its channel before its first token and be held until then, and that hold is neither a wait
    # for the link nor time on it.
    ready_ns: int | None = None
    ended_ns: int | None = None
    wire_bytes: int = 0
    frames: int = 0
    rate_Bps: float = 0.0  # configured rate when the transfer started
    latency_s: float = 0.0  # configured latency when the transfer started
    # Another flow's bytes (EgressShaper.stamp) serialised on its channel within its time on the link, set when it
    # ends: the link's achieved rate counts them with its own bytes.
    shared_bytes: float = 0.0

    @property
    def queue_s(self) -> float:
        """How long it waited for a channel after it was queued and ready (docs/reference.md §4: the link's FIFO)."""
        if self.started_ns is None:
            return 0.0
        return max(0, self.started_ns - max(self.queued_ns, self.ready_ns or self.queued_ns)) / 1e9

    @property
    def transfer_s(self) -> float:
        """Its time on the link: from when it had both its channel and its first frame ready to its last write."""
        if self.started_ns is None or self.ended_ns is None:
            return 0.0
        return max(0, self.ended_ns - max(self.started_ns, self.ready_ns or self.started_ns)) / 1e9

    @property
    def modelled_s(self) -> float:
        """docs/reference.md §2: transfer_time = latency + bytes / bandwidth."""
        return self.latency_s + self.wire_bytes / self.rate_Bps if self.rate_Bps else 0.0

    @property
    def achieved_rate_Bps(self) -> float:
        """Bytes over the time the link spent serialising them (the latency is not link time)."""
        serialising = self.transfer_s - self.latency_s
        return (self.wire_bytes + self.shared_bytes) / serialising if serialising > 0 else 0.0


@dataclass
class _Channel:
    index: int
    bucket: TokenBucket
    delay: DelayLine


def _slices(parts: Sequence[Part], slice_bytes: int) -> Iterator[memoryview]:
    for part in parts:
        view = memoryview(part).cast("B")
        for start in range(0, len(view), slice_bytes):
            yield view[start:start + slice_bytes]


class EgressShaper:
    """Shapes hand-offs onto downstream endpoints at `rate_Bps` with `latency_s` (both live-tunable)."""

    def __init__(self, *, rate_Bps: float, latency_s: float = 0.0, jitter_s: float = 0.0, channels: int = 1,
                 clock: Clock | None = None, slice_bytes: int = DEFAULT_SLICE_BYTES,
                 lead_bytes: int | None = None, burst_bytes: int = 0,
                 on_transfer_done: Callable[[TransferRecord], None] | None = None):
        """`burst_bytes`: what the bucket lets through at once after idle. 0 (the default, our bucket shapes
        the link): an N-byte transfer takes exactly N / rate (docs/reference.md §2). A kernel qdisc that shapes the link
        itself (tc) is handed the first slice at the transfer's start, so its own full bucket, which the
        middlebox's start hold accounts for, is not left idle while ours meters out the first slice."""
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels must be an integer >= 1, got {channels!r}")
        if slice_bytes < 1:
            raise ValueError(f"slice_bytes must be >= 1, got {slice_bytes!r}")
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.slice_bytes = slice_bytes
        self.lead_bytes = DEFAULT_LEAD_SLICES * slice_bytes if lead_bytes is None else lead_bytes
        self.on_transfer_done = on_transfer_done
        # With burst 0 the bucket starts empty, so reserve() returns when each slice's last byte has been
        # serialised, and an N-byte transfer takes exactly N / rate (docs/reference.md §2).
        self._channels = [_Channel(i, TokenBucket(rate_Bps, burst_bytes), DelayLine(latency_s, jitter_s))
                          for i in range(channels)]
        self.rate_Bps = float(rate_Bps)
        self.latency_s = float(latency_s)
        self._free: deque[_Channel] = deque(self._channels)
        self._waiters: deque[asyncio.Future[_Channel]] = deque()
        self.started_ns = self.clock.now_ns()
        # Totals for metrics (the fidelity guard reads achieved vs configured rate).
        self.bytes_sent = 0
        self.stamped_bytes = 0  # another flow's frames stamped on channel 0 (stamp)
        self._rate_bytes = 0.0  # the bytes the achieved rate divides: the transfers' own and those stamped among them
        # Recent stamped frames on channel 0, (serialising start, end, bytes) in clock seconds (STAMPED_SPANS kept).
        self._stamped: deque[tuple[float, float, int]] = deque(maxlen=STAMPED_SPANS)
        self.busy_s = 0.0
        self.serialising_s = 0.0
        self.transfers_done = 0
        self.active = 0

    @property
    def channels(self) -> int:
        return len(self._channels)

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def set_rate(self, rate_Bps: float) -> None:
        now_s = self.clock.now_ns() / 1e9
        for channel in self._channels:
            channel.bucket.set_rate(rate_Bps, now_s)  # validates (ShapingError) before anything changes
        self.rate_Bps = float(rate_Bps)

    def set_latency(self, latency_s: float, jitter_s: float | None = None) -> None:
        for channel in self._channels:
            channel.delay.set_delay(latency_s, jitter_s)
        self.latency_s = float(latency_s)

    @property
    def achieved_rate_Bps(self) -> float:
        """Bytes over link serialising time, over every finished transfer (another flow's bytes stamped while one
        ran included: they took that time)."""
        return self._rate_bytes / self.serialising_s if self.serialising_s > 0 else 0.0

    def busy_ratio(self, now_ns: int | None = None) -> float:
        """docs/reference.md §2: sum of per-transfer occupancy / wall time (can exceed 1 with channels > 1)."""
        wall = ((self.clock.now_ns() if now_ns is None else now_ns) - self.started_ns) / 1e9
        return self.busy_s / wall if wall > 0 else 0.0

    def stamp(self, nbytes: int, ready_ns: int) -> int:
        """When `nbytes` sent at `ready_ns` outside any transfer (a frame of another flow on this link: remote KV's
        legs, flows/selection/middlebox_relay.py) are due at the far end: they take their time on channel 0's bucket,
        after or between the hand-offs' slices already reserved there, then its delay line."""
        channel = self._channels[0]
        serialised_s = channel.bucket.reserve(nbytes, ready_ns / 1e9)
        self.stamped_bytes += nbytes
        on_link_s = nbytes / channel.bucket.rate_Bps
        self._stamped.append((serialised_s - on_link_s, serialised_s, nbytes))
        self.busy_s += on_link_s  # less what falls inside a transfer's time, when it ends (_account)
        return round(channel.delay.release_time(serialised_s) * 1e9)

    async def _acquire(self) -> _Channel:
        if self._free and not self._waiters:
            return self._free.popleft()
        waiter: asyncio.Future[_Channel] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())  # handed a channel as we were cancelled: pass it on
            raise

    def _release(self, channel: _Channel) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(channel)
                return
        self._free.append(channel)

    @contextlib.asynccontextmanager
    async def transfer(self, downstream: Endpoint, label: str = "") -> AsyncIterator[Transfer]:
        """Wait (FIFO) for a channel and the downstream endpoint; yield a Transfer to send frames with.

        On a clean exit, returns once every byte has been written downstream (record.ended_ns set)."""
        record = TransferRecord(label=label, queued_ns=self.clock.now_ns())
        channel = await self._acquire()
        try:
            async with downstream.exclusive():
                record.channel = channel.index
                record.started_ns = self.clock.now_ns()
                record.rate_Bps, record.latency_s = self.rate_Bps, self.latency_s
                self.active += 1
                transfer = Transfer(self, channel, downstream, record)
                try:
                    yield transfer
                    await transfer._finish()
                finally:
                    self.active -= 1
                    await transfer._stop()
        finally:
            self._release(channel)
        self._account(record)

    def _account(self, record: TransferRecord) -> None:
        if record.channel == 0 and self._stamped and record.started_ns is not None and record.ended_ns is not None:
            # Another flow's bytes serialised within this transfer's time on the link (pro rata for a frame that
            # straddles its start or end): its time counts them, so its rate does too, and the link's busy time has
            # them once.
            lo = max(record.started_ns, record.ready_ns or record.started_ns) / 1e9
            hi = record.ended_ns / 1e9 - record.latency_s
            for start, end, nbytes in self._stamped:
                overlap = max(0.0, min(end, hi) - max(start, lo))
                if overlap > 0:
                    record.shared_bytes += nbytes * overlap / (end - start)
                    self.busy_s -= overlap
        self.bytes_sent += record.wire_bytes
        self._rate_bytes += record.wire_bytes + record.shared_bytes
        self.busy_s += record.transfer_s
        self.serialising_s += max(0.0, record.transfer_s - record.latency_s)
        self.transfers_done += 1
        if self.on_transfer_done is not None:
            self.on_transfer_done(record)


class Transfer:
    """One hand-off in progress on one channel. Use `await send(event)` for each frame, in order."""

    def __init__(self, shaper: EgressShaper, channel: _Channel, endpoint: Endpoint, record: TransferRecord):
        self._shaper = shaper
        self._clock = shaper.clock
        self._channel = channel
        self._endpoint = endpoint
        self.record = record
        self._due: deque[tuple[int, Part]] = deque()
        self._more = asyncio.Event()
        self._closing = False
        self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name=f"egress {record.label}")

    async def send(self, event: Any, *, ready_ns: int | None = None, min_serialise_s: float = 0.0) -> None:
        """Queue one frame for the link; returns when the link is within `lead_bytes` of finishing it.

        `ready_ns`: when the frame became ready to send (default now); its slices' deadlines count
        from then, so time spent since is not charged twice. `min_serialise_s`: the frame occupies the
        channel at least this long (a module slower than the link: docs/reference.md §5's
        `max(wire / bw, ops / (budget × bw))`); the shortfall is held before the frame's first byte."""
        self._raise_if_writer_failed()
        parts = self._endpoint.connection.send_parts(event)
        ready_s = (self._clock.now_ns() if ready_ns is None else ready_ns) / 1e9
        if self.record.ready_ns is None and ready_ns is not None:  # without one, it was ready when it queued
            self.record.ready_ns = ready_ns
        bucket, delay = self._channel.bucket, self._channel.delay
        if min_serialise_s > 0:
            # A burst (burst_bytes) would let the frame's first bytes through at once and shorten the module's
            # hold by its tokens: the hold takes those tokens too, so the frame occupies min_serialise_s in full.
            shortfall = (min_serialise_s * bucket.rate_Bps - sum(memoryview(p).nbytes for p in parts)
                         + bucket.available(ready_s))
            if shortfall >= 1:
                bucket.reserve(int(shortfall), ready_s)
        for piece in _slices(parts, self._shaper.slice_bytes):
            # Reserve slice by slice, never more than lead_bytes ahead of the serialiser: memory stays
            # bounded and a live rate change applies to the rest of a frame, not only the next one.
            serialised_s = bucket.reserve(len(piece), ready_s)
            release_ns = round(delay.release_time(serialised_s) * 1e9)
            # The slice waits in our queue past this call, and its owner may reuse the memory (a
            # received payload view is overwritten at the next receive): keep our own copy.
            self._due.append((release_ns, bytes(piece) if is_borrowed(piece) else piece))
            self._more.set()
            self.record.wire_bytes += len(piece)
            lead_ns = round(max(self._shaper.lead_bytes / bucket.rate_Bps, MIN_LEAD_S) * 1e9)
            await self._clock.sleep_until(round(serialised_s * 1e9) - lead_ns)
            self._raise_if_writer_failed()
        self.record.frames += 1

    def _raise_if_writer_failed(self) -> None:
        if self._writer.done() and not self._writer.cancelled() and self._writer.exception() is not None:
            raise self._writer.exception()  # type: ignore[misc]

    async def _write_loop(self) -> None:
        while True:
            while not self._due:
                if self._closing:
                    return
                self._more.clear()
                await self._more.wait()
            await self._clock.sleep_until(self._due[0][0])
            # Everything already due goes out in one writelines (after a late wake-up, several slices are).
            now = self._clock.now_ns()
            batch: list[Part] = []
            while self._due and self._due[0][0] <= now:
                batch.append(self._due.popleft()[1])
            await self._endpoint.write_parts(batch)
            self.record.ended_ns = self._clock.now_ns()

    async def _finish(self) -> None:
        self._closing = True
        self._more.set()
        await self._writer  # raises what the writer raised
        if self.record.ended_ns is None:  # nothing was sent: the transfer ends when it is closed
            self.record.ended_ns = self._clock.now_ns()

    async def _stop(self) -> None:
        if not self._writer.done():
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
