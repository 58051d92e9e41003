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

Memory: the streams read from one source connection (a prefill's hand-off connection, or its pool connection)
share that connection's `ByteBudget`, the middlebox's in-flight limit: `ingest` waits while the connection is
over it, so the reader stops and TCP pushes back, and a chunk's bytes are given back once it is on the link
(or dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvtransit.kernels import KernelInputError
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.egress import Transfer
from kvtransit.wire import ErrorCode, clip_message
from kvtransit.wire.events import Error, KvBegin, KvChunk, KvEnd

from .chunk_in_flight import ChunkInFlight
from .stages import StageChain
from .stages.kernel import RUNS_ON_NONE, ActiveKernel

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


# -- what the stream's queue holds ----------------------------------------------------------------------

@dataclass(frozen=True)
class Staged:
    """A chunk on its way down the stages; it holds `nbytes` of the budget until it is on the link."""

    result: asyncio.Future[ChunkInFlight]
    nbytes: int


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
        self._queue.put_nowait(Staged(result, nbytes))

    def end(self) -> None:
        self._queue.put_nowait(Ended())

    def abort(self, reason: str, code: ErrorCode = ErrorCode.REQUEST_FAILED) -> None:
        self._queue.put_nowait(Aborted(reason, code))

    # -- the link's side --------------------------------------------------------------------------------

    def next_hop_begin(self, begin: KvBegin) -> KvBegin:
        """The source's KvBegin as the next hop must see it: a raw stream that this stream's kernel compresses
        is announced with the kernel's codec (a stream that arrived encoded keeps what its source announced)."""
        if begin.codec == "none" and self.kernel.codec is not None:
            return replace(begin, codec=self.kernel.name)
        return begin

    async def deliver(self, link: Transfer, *, kv_end: Callable[[int], KvEnd], ready_ns: int | None = None,
                      on_sent: Callable[[ChunkInFlight], None]) -> StreamOutcome:
        """Put the stream on `link` in order, until it ends. `kv_end`: the downstream connection's closing
        frame (its CRC covers what that connection sent); `ready_ns`: when the chunks count as ready (the
        link paces from then); `on_sent`: called with each chunk once it is on the link."""
        rid = self.request_id
        while True:
            match await self._queue.get():
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
                    await link.send(item.chunk, ready_ns=ready_ns, min_serialise_s=item.modelled_compute_s)
                    self._release(nbytes)
                    on_sent(item)

    async def discard(self) -> None:
        """Release whatever the stream still holds, up to its end (after a failure, it may still arrive)."""
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
