"""One KV stream through the middlebox: chunks in, down the stage chain, onto the link in order.

Both of the middlebox's KV paths carry their streams this way: a hand-off (prefill → decode, app.py) and a
write-back (prefill → kvpool, pool.py).

- The reader of the source connection calls `ingest` for each KvChunk: the chunk is copied out of the
  receive buffer and sent down the stage chain at once (the kernel runs on its worker thread), and a
  `Staged` entry holding that future joins the stream's queue. The source's KvEnd queues `Ended`; a source
  that gives up or goes away queues `Aborted`.
- The writer, holding a link channel, calls `deliver`: it takes the entries in order, waits for each
  chunk's stages and puts the result on the link, so the kernel works on chunk n+1 while chunk n crosses.
  It returns how the stream ended (`Delivered`, `Abandoned`, `Refused`); in the last two the next hop has
  been told with an Error naming the request, so it drops what it holds.
- After a failure, `discard` releases whatever the stream still holds (its source may still be sending).
- A chunk that says when its KV came to exist (`KvChunk.release_ns`: layer-wise streaming, chunked
  prefill) is held until then (plus the link's start hold) before it goes on the link. An abort stops such a
  stream at once, even one its source had ended: the prefill failed mid-step, so the layers it had not computed
  yet never existed and none of them is released.

Memory: the streams read from one source connection (a prefill's hand-off connection, or its pool connection)
share that connection's `ByteBudget`, the middlebox's in-flight limit: `ingest` waits while the connection is
over it, so the reader stops and TCP pushes back, and a chunk's bytes are given back once it is on the link
(or dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.agents.middlebox.stages import StageChain
from kvtransit.agents.middlebox.stages.kernel import RUNS_ON_NONE, ActiveKernel
from kvtransit.kernels import KernelInputError
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.egress import Transfer
from kvtransit.wire import ErrorCode, clip_message
from kvtransit.wire.events import Error, KvBegin, KvChunk, KvEnd

# Where an already-encoded chunk was encoded: the prefill compressed at the GPU (--compress-at gpu).
RUNS_ON_GPU = "gpu"


class ByteBudget:
    """Bytes one connection may hold in the middlebox; acquire waits while over the limit.

    One acquirer (the connection's reader) at a time; a single chunk larger than the limit is let through
    alone, so a big chunk can never wedge the connection."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._waiter: asyncio.Future[None] | None = None

    async def acquire(self, nbytes: int) -> None:
        while self.used and self.used + nbytes > self.limit:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        self.used += nbytes

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class BurstHold(Protocol):
    """What holds a frame for tc's burst (stages/link.py: LinkStage, its tbf mirror)."""

    def burst_hold_ns(self, ready_ns: int, nbytes: int) -> int: ...

    def burst_at_once_bytes(self, ready_ns: int) -> float: ...

    def on_wire(self, at_ns: int, nbytes: int) -> None: ...


# -- what the stream's queue holds ----------------------------------------------------------------------

@dataclass(frozen=True)
class Staged:
    """A chunk on its way down the stages; it holds `nbytes` of the budget until it is on the link."""

    result: asyncio.Future[ChunkInFlight]
    nbytes: int
    release_ns: int = 0  # the chunk's own release time (KvChunk.release_ns), 0 for none


@dataclass(frozen=True)
class Ended:
    """The source's KvEnd arrived: the stream is complete."""


@dataclass(frozen=True)
class Aborted:
    """The stream cannot complete: its source gave up (its Error, whose code is passed on) or went away."""

    reason: str
    code: ErrorCode = ErrorCode.REQUEST_FAILED


QueueEntry = Staged | Ended | Aborted


# -- how `deliver` ended --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Delivered:
    """Every chunk and the closing KvEnd went out."""


@dataclass(frozen=True)
class Abandoned:
    """The source aborted the stream; the next hop was sent an Error naming the request."""

    reason: str


@dataclass(frozen=True)
class Refused:
    """The kernel refused a chunk; the next hop was sent an Error naming the request."""

    reason: str


StreamOutcome = Delivered | Abandoned | Refused


class KvStream:
    """One request's KV between its source connection and the link (see the module docstring)."""

    def __init__(self, request_id: int, stages: StageChain, kernel: ActiveKernel,
                 budget: ByteBudget | None = None):
        """`kernel`: the one the stream started with (a live kernel change applies to later streams)."""
        self.request_id = request_id
        self.kernel = kernel
        self._stages = stages
        self._budget = budget
        self._queue: asyncio.Queue[QueueEntry] = asyncio.Queue()
        self.finished = False  # the writer has taken Ended or Aborted: nothing more will be queued
        # An abort, seen at once by a writer holding a chunk for its release time (the queue is in order).
        self._aborted: asyncio.Future[Aborted] = asyncio.get_running_loop().create_future()

    # -- the source's side ------------------------------------------------------------------------------

    async def ingest(self, event: KvChunk, *, source_codec: str) -> None:
        """Start one chunk down the stages (waiting first while the connection is over its byte budget).

        `source_codec`: what the source's KvBegin announced, the codec of a chunk that arrives encoded."""
        nbytes = len(event.payload)
        if self._budget is not None:
            await self._budget.acquire(nbytes)
        # The payload is a view into the receive buffer, valid until the next read: take our own copy, then
        # let the view go at once, so the connection reuses its buffer instead of allocating a new one. numpy
        # copies with the GIL released (bytes() holds it, page faults and all: 16 % of the GIL-holding samples
        # of a relaying middlebox, time the kernel thread waited; benchmarks/RESULTS.md, Capacity).
        chunk = replace(event, payload=np.frombuffer(event.payload, np.uint8).copy().data)
        if isinstance(event.payload, memoryview):
            event.payload.release()
        encoded = bool(event.codec_id)
        item = ChunkInFlight(chunk=chunk, raw_bytes=event.raw_bytes, codec=source_codec if encoded else "none",
                             runs_on=RUNS_ON_GPU if encoded else RUNS_ON_NONE)
        result = asyncio.ensure_future(self._stages.run(item, self.kernel))
        self._queue.put_nowait(Staged(result, nbytes, event.release_ns))

    def end(self) -> None:
        self._queue.put_nowait(Ended())

    def abort(self, reason: str, code: ErrorCode = ErrorCode.REQUEST_FAILED) -> None:
        entry = Aborted(reason, code)
        self._queue.put_nowait(entry)
        if not self._aborted.done():
            self._aborted.set_result(entry)

    # -- the link's side --------------------------------------------------------------------------------

    def next_hop_begin(self, begin: KvBegin) -> KvBegin:
        """The source's KvBegin as the next hop must see it: a raw stream that this stream's kernel compresses
        is announced with the kernel's codec (a stream that arrived encoded keeps what its source announced)."""
        if begin.codec == "none" and self.kernel.codec is not None:
            return replace(begin, codec=self.kernel.name)
        return begin

    async def deliver(self, link: Transfer, *, kv_end: Callable[[int], KvEnd], ready_ns: int | None = None,
                      on_sent: Callable[[ChunkInFlight], None], clock: Clock | None = None,
                      burst: BurstHold | None = None, begin: KvBegin | None = None) -> StreamOutcome:
        """Put the stream on `link` in order, until it ends. `kv_end`: the downstream connection's closing
        frame (its CRC covers what that connection sent); `ready_ns`: when the chunks count as ready (the
        link paces from then); `on_sent`: called with each chunk once it is on the link. A chunk with a
        `release_ns` of its own is ready then, plus what `burst` holds it by, and is held until that time on
        `clock`; `burst` is told every chunk's bytes as they leave (the link stage's tbf mirror, None without tc).
        `begin`: the stream's KvBegin, sent first, ready with the first entry (a streamed chunk released before
        its bytes got here is paced from its release: the link's timeline catches up on the host's delay).

        A whole stream (its first chunk has no release time) is held from `ready_ns` by what `burst` lets through
        at once of its *wire* bytes: the kernel's output is awaited up to the burst first (`_burst_head`)."""
        rid = self.request_id
        head: deque[QueueEntry] = deque()
        if burst is not None and ready_ns is not None:
            hold_ns, head = await self._burst_head(burst, ready_ns)
            ready_ns += hold_ns
        while True:
            entry = head.popleft() if head else await self._queue.get()
            if begin is not None:
                first_ready_ns = entry.release_ns if isinstance(entry, Staged) and entry.release_ns else ready_ns
                await link.send(begin, ready_ns=first_ready_ns)
                begin = None
            match entry:
                case Ended():
                    self.finished = True
                    await link.send(kv_end(rid))
                    return Delivered()
                case Aborted(reason, code):
                    self.finished = True
                    await link.send(Error(code=code, message=clip_message(reason), request_id=rid))
                    return Abandoned(reason)
                case Staged(result, nbytes):
                    try:
                        item = await result
                    except (KernelInputError, ConfigError) as exc:
                        self._release(nbytes)
                        reason = f"kernel {self.kernel.name} refused request {rid}: {exc}"
                        await link.send(Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(reason),
                                              request_id=rid))
                        return Refused(reason)
                    chunk_ready_ns = ready_ns
                    if item.chunk.release_ns:
                        release_ns = item.chunk.release_ns
                        chunk_ready_ns = release_ns + (burst.burst_hold_ns(release_ns, item.wire_bytes)
                                                       if burst is not None else 0)
                        if clock is not None:
                            aborted = await self._hold_until(clock, chunk_ready_ns)
                            if aborted is not None:  # the rest of the queue is drained by `discard`
                                self._release(nbytes)
                                await link.send(Error(code=aborted.code, message=clip_message(aborted.reason),
                                                      request_id=rid))
                                return Abandoned(aborted.reason)
                    await link.send(item.chunk, ready_ns=chunk_ready_ns, min_serialise_s=item.modelled_compute_s)
                    if burst is not None and (left_ns := chunk_ready_ns or (clock.now_ns() if clock else None)):
                        burst.on_wire(left_ns, item.wire_bytes)
                    self._release(nbytes)
                    on_sent(item)

    async def _burst_head(self, burst: BurstHold, ready_ns: int) -> tuple[int, deque[QueueEntry]]:
        """How long a whole stream ready at `ready_ns` is held for tc's burst, and the entries taken to know it.

        tbf lets its bucket's bytes through at once, so a stream held by the time of the bytes that pass at once,
        min(wire, bucket) / rate, ends when latency + wire / rate says (stages/link.py: TbfMirror). The wire bytes
        are the kernel's output: holding by the raw bytes held a compressed hand-off smaller than the bucket by
        (min(raw, bucket) − wire) / rate too long (ib-ndr at 1/1024, band-keep: 131 KB of wire under a 130 KB
        bucket was held for 262 KB of raw, idle-link hand-offs 1.54x the model at their median). So the head's
        chunks are awaited (their kernel runs on its thread meanwhile) until their wire bytes fill the bucket or the
        stream ends. Streamed chunks (a release time of their own) are each held by their own bytes in `deliver`."""
        at_once = burst.burst_at_once_bytes(ready_ns)
        head: deque[QueueEntry] = deque()
        wire = 0.0
        held = 0
        while wire < at_once:
            entry = await self._queue.get()
            head.append(entry)
            if not isinstance(entry, Staged):
                break  # ended or aborted: every wire byte is known
            if entry.release_ns:
                return 0, head  # streamed: each chunk is held by its own bytes
            held += entry.nbytes
            try:
                wire += (await entry.result).wire_bytes
            except Exception:  # the failure is deliver's to report, in order; hold as for a full bucket
                wire = at_once
            if self._budget is not None and 2 * held > self._budget.limit:
                wire = at_once  # never wedge the reader on the budget: take the rest as filling the bucket
        return burst.burst_hold_ns(ready_ns, math.ceil(min(wire, at_once))), head

    async def _hold_until(self, clock: Clock, due_ns: int) -> Aborted | None:
        """Wait until `due_ns` on `clock`, or less if the stream is aborted meanwhile (then its Aborted entry)."""
        if self._aborted.done():
            return self._aborted.result()
        if clock.now_ns() >= due_ns:
            return None
        held = asyncio.ensure_future(clock.sleep_until(due_ns))
        waits: list[asyncio.Future[Any]] = [held, self._aborted]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await held
        return self._aborted.result() if self._aborted.done() else None

    async def discard(self) -> None:
        """Release whatever the stream still holds, up to its end (after a failure, it may still arrive; after an
        abort that stopped a held chunk, up to the Ended or Aborted entry already queued)."""
        while not self.finished:
            match await self._queue.get():
                case Ended() | Aborted():
                    self.finished = True
                case Staged(result, nbytes):
                    with contextlib.suppress(Exception):
                        await result
                    self._release(nbytes)

    def _release(self, nbytes: int) -> None:
        if self._budget is not None:
            self._budget.release(nbytes)
