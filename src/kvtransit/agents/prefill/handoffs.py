"""The prefill's side of every hand-off: its KV link to the middlebox, and recovery when that link fails.

A request that hands off is held here from its step (`hold`) until decode's Ack, relayed by the middlebox,
releases it; what is held is the recipe of its frames, which are made as they are sent (handoff_frames.py).
Its frames go out one hand-off after another, FIFO (the hand-off link is a FIFO, docs/reference.md §4).
- An Ack releases the KV; a FAILED Ack is a refusal for good (decode cannot hold it, the kernel refused it),
  and the client is told why.
- An Error naming the request means this attempt did not get through (the link to decode, or decode itself,
  failed behind the middlebox): it is sent again after a backoff, until its deadline.
- When the link itself fails (the middlebox died, the link reset), it is dialled again with backoff and every
  held, unacked hand-off goes again, oldest first; decode drops and re-acks a KV it already has.
- A hand-off still unacked at its deadline (HANDOFF_DEADLINE_S after its first token) is given up: its KV is
  released, it counts as failed, and the client is told why. No KV is held forever.
- A hand-off whose client went away (`cancel`: the client's Error naming the request) is released at once: no
  Ack is waited for and no retry made. If its frames are going out, the stream stops at the next chunk and is
  aborted with an Error naming the request (the middlebox and decode drop what they had, as for any source that
  gave up); one already sent whole is dropped by decode, which the client told too.

Deadlines are read on the injected clock; the housekeeping waits (backoff, the expiry poll) stay on the loop's
own timer, so the fidelity guard's wake-up figures count model-time holds only.

A streamed hand-off (layer-wise, or chunked prefill) holds a `ReleaseSchedule` beside its recipe: the
step loop adds each KV segment's step as it plans it, every frame is stamped with when its layer's compute ends
there (`KvChunk.release_ns`), and the sender waits for a segment's step before making its frames (a chunk that is
not planned yet has no KV). The middlebox holds each frame until its release time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol

from kvtransit.agents.process import Address
from kvtransit.model.serving.layerwise import StepWindow, release_ns
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.redial import dial_within, redial
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Endpoint, open_greeted
from kvtransit.wire.errors import ErrorCode, ProtocolError
from kvtransit.wire.events import Ack, AckStatus, Bye, Error, KvBegin, KvChunk, Request, Role
from kvtransit.wire.limits import clip_message

log = logging.getLogger(__name__)

# A hand-off not acked within this many wall seconds of its first token is given up, and the client is told
# why (30 s is far above a restart of the middlebox, ~1-2 s here, and a 2 s link outage, the chaos suite's
# faults). KVTRANSIT_HANDOFF_DEADLINE_S overrides it (tests).
HANDOFF_DEADLINE_S = float(os.environ.get("KVTRANSIT_HANDOFF_DEADLINE_S", "30"))
# Reconnecting to the middlebox, and retrying a hand-off whose attempt failed: exponential backoff.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
# How long the first connection to the middlebox may take at start-up (it may start after us, as decode
# may for the middlebox: compose).
CONNECT_TIMEOUT_S = 30.0
# How often held hand-offs are checked against their deadlines (a dead middlebox would otherwise hold them
# until it came back); a quarter second is well inside the 30 s deadline and costs nothing.
EXPIRY_POLL_S = 0.25


class FrameSource(Protocol):
    """A hand-off's KvChunks, made a layer at a time when the link sends them, and made again, identical, if
    it sends them again: nothing is held between sends (handoff_frames.py)."""

    @property
    def n_layers(self) -> int: ...

    @property
    def n_segments(self) -> int: ...

    def layer_chunks(self, layer: int, segment: int = 0, release_ns: int = 0) -> list[KvChunk]:
        """Layer `layer`'s chunks of token segment `segment` in wire order, stamped with `release_ns` (run on a
        worker thread: it must not touch the loop)."""
        ...


class ReleaseSchedule:
    """When each token segment of a streamed hand-off's KV is computed: the step loop `plan`s each segment's step
    as it schedules it; `release_ns` is then when a layer of it exists (model/serving/layerwise.py)."""

    def __init__(self, mode: str, layers: int, stops: tuple[int, ...]):
        """`stops`: where each segment ends along the prompt's tokens (HandoffFrames.stops)."""
        self.mode, self.layers, self.stops = mode, layers, stops
        self.windows: list[StepWindow | None] = [None] * len(stops)
        self._planned = asyncio.Event()
        self.cancelled = False  # its request was cancelled: the segments not planned yet never will be

    def plan(self, stop: int, window: StepWindow) -> None:
        """The prefill chunk ending at token `stop` runs in `window`; a chunk merged into the segment after it
        (model/serving/layerwise.py: kv_segments) releases nothing of its own."""
        if stop in self.stops:
            self.windows[self.stops.index(stop)] = window
            self._planned.set()

    def planned(self, segment: int) -> bool:
        return self.windows[segment] is not None

    async def wait(self, segment: int) -> None:
        """Until `segment` is planned, or the request is cancelled (then it never will be: the caller checks)."""
        while not self.planned(segment) and not self.cancelled:
            self._planned.clear()
            await self._planned.wait()

    def cancel(self) -> None:
        self.cancelled = True
        self._planned.set()

    def release_ns(self, segment: int, layer: int) -> int:
        window = self.windows[segment]
        assert window is not None, f"segment {segment} is not planned yet"
        return release_ns(self.mode, window.start_ns, window.duration_ns, layer, self.layers)


def _all_chunks(frames: FrameSource) -> list[KvChunk]:
    return [chunk for segment in range(frames.n_segments) for layer in range(frames.n_layers)
            for chunk in frames.layer_chunks(layer, segment)]


@dataclass
class HeldHandoff:
    """One request's hand-off, held from its step until an Ack releases it (or its deadline gives it up)."""

    request: Request
    client: Endpoint  # the load generator's connection: told when the hand-off fails for good
    begin: KvBegin
    frames: FrameSource
    deadline_ns: int  # give up (with the reason) if still unacked at this time
    attempts: int = 0  # sends begun
    last_error: str = ""
    queued: bool = False  # waiting in the send queue (never twice)
    made: list[KvChunk] | None = None  # its chunks, made at `hold` when the link was idle; dropped once sent
    eager: bool = False  # streamed, found the link idle: its other layers are made on the loop (HandoffLink.hold)
    # Streamed (layer-wise, chunked prefill): when each segment's KV exists; None: whole, ready at the first token.
    schedule: ReleaseSchedule | None = None
    cancelled: str = ""  # why its client withdrew it (`HandoffLink.cancel`); its frames stop going out

    @property
    def request_id(self) -> int:
        return self.request.request_id


class HandoffLink:
    """The KV link to the middlebox and the hand-offs held on it (see the module docstring)."""

    def __init__(self, *, name: str, kv_to: Address, clock: Clock, metrics: runtime_metrics.PrefillMetrics):
        self.name = name
        self.kv_to = kv_to
        self.clock = clock
        self.metrics = metrics
        self.held: dict[int, HeldHandoff] = {}  # request id → held until acked or given up
        self._out: asyncio.Queue[HeldHandoff] = asyncio.Queue()
        self._held_bytes: dict[int, int] = {}  # request id → KV bytes sent and not yet acked
        self._sending: HeldHandoff | None = None  # the hand-off whose frames are going out right now
        self.link: Endpoint | None = None
        self.retries = 0
        self.given_up = 0
        self.kv_sent_bytes = 0
        self.acked = {"ok": 0, "failed": 0}
        self.cancelled = 0  # hand-offs released because their client went away
        self.begin_lag_s = 0.0  # first token → KvBegin written, summed: the sender's share of the hand-off
        self.make_s = 0.0  # real time spent making (and, on the GPU side, encoding) KV frames

    def hold(self, handoff: HeldHandoff) -> None:
        """Hold `handoff` until its Ack and queue it for the link."""
        self.held[handoff.request_id] = handoff
        if self._sending is None and self._out.empty():
            # An idle link: make the bytes now, inside the step, so the sender only writes them and they reach
            # the middlebox before even a short step's first token (made lazily a layer at a time, a light run's
            # idle-link hand-offs measured up to 1.04x the model). Only behind a backlog is the KV left a recipe.
            # Streamed: only its first layer now, and the rest a layer at a time on the loop as the sender writes
            # them (`eager`). Its layers are due from the step's start, one every step / L, so the first must not
            # wait for all: made whole here (4.6 MB, 3-4 ms), layer 0 crossed a tc-shaped link ~3 ms (model) later
            # than the model has it, and tbf cannot win back lost time (idle-link exposed hand-offs 1.11-1.13x the
            # model at 8 req/s, codec none, dilation 2; benchmarks/RESULTS.md, "Layer-wise"). Made off the
            # loop a layer at a time instead, each layer waits for a worker thread and the GIL: the last layers
            # reached the middlebox after the first token (measured).
            started = time.perf_counter()
            schedule = handoff.schedule
            if schedule is None:
                handoff.made = _all_chunks(handoff.frames)
            else:
                handoff.made = handoff.frames.layer_chunks(0, 0, schedule.release_ns(0, 0))
                handoff.eager = True
            self.make_s += time.perf_counter() - started
        self._enqueue(handoff)

    def cancel(self, request_id: int, reason: str) -> bool:
        """The request's client went away (`reason`, the client's words): release its KV now (module docstring).
        False when nothing is held for it."""
        handoff = self.held.get(request_id)
        if handoff is None:
            return False
        handoff.cancelled = reason or "cancelled by its client"
        if handoff.schedule is not None:
            handoff.schedule.cancel()  # a sender waiting for its next segment's step stops waiting
        self._release(request_id)
        self.cancelled += 1
        return True

    def _enqueue(self, handoff: HeldHandoff) -> None:
        if not handoff.queued:
            handoff.queued = True
            self._out.put_nowait(handoff)

    # -- one session on one connection ---------------------------------------------------------------------

    async def _sender(self, link: Endpoint) -> None:
        """One request's KV after another, in FIFO order."""
        while True:
            handoff = await self._out.get()
            handoff.queued = False
            rid = handoff.request_id
            if self.held.get(rid) is not handoff:
                continue  # acked or given up while it waited
            if self.clock.now_ns() >= handoff.deadline_ns:
                await self._give_up(handoff)
                continue
            handoff.attempts += 1
            if handoff.attempts > 1:
                self.retries += 1
                self.metrics.handoff_retries.inc()
            self._sending = handoff
            try:
                # Bounded by the hand-off's deadline: a middlebox that stops reading (TCP back-pressure)
                # must not hold this KV, or the ones queued behind it, forever.
                remaining_s = max(0.0, (handoff.deadline_ns - self.clock.now_ns()) / 1e9)
                async with asyncio.timeout(remaining_s):
                    await self._send_frames(link, handoff)
            except TimeoutError:
                handoff.last_error = f"the middlebox at {self.kv_to} took no more bytes (stalled mid-stream)"
                await self._give_up(handoff)
                # Its stream is cut mid-frame: the connection cannot carry anything more. The middlebox sees it
                # close and drops the partial stream; the other held hand-offs go again on a new connection.
                raise ConnectionError(f"request {rid} stalled mid-stream past its deadline") from None
            except (ConnectionError, ProtocolError) as exc:
                handoff.last_error = f"KV link to the middlebox at {self.kv_to} failed: {exc}"
                raise  # the session ends; the hand-off is held and goes again on the next connection
            finally:
                self._sending = None

    async def _send_frames(self, link: Endpoint, handoff: HeldHandoff) -> None:
        first = handoff.attempts == 1
        rid = handoff.request_id
        if handoff.cancelled:  # withdrawn since the sender took it: nothing of it went out
            return
        await link.send(handoff.begin)
        if first and handoff.begin.first_token_ns:  # 0: chunked prefill, its first token not planned yet
            self.begin_lag_s += (self.clock.now_ns() - handoff.begin.first_token_ns) / 1e9
        self._held_bytes[rid] = 0
        async with contextlib.aclosing(self._chunk_batches(handoff)) as batches:
            async for chunks in batches:
                for chunk in chunks:
                    if handoff.cancelled:
                        break
                    await link.send(chunk)
                    if rid in self._held_bytes:  # (released by a cancel while that chunk was going out)
                        self._held_bytes[rid] += len(chunk.payload)
                    if first:
                        self.kv_sent_bytes += len(chunk.payload)
                        self.metrics.kv_sent_bytes.labels(codec=handoff.begin.codec).inc(len(chunk.payload))
                self.metrics.kv_held_bytes.set(sum(self._held_bytes.values()))
                if handoff.cancelled:
                    break
        if handoff.cancelled:  # the client went away mid-stream: abort it, the hops behind drop what they had
            self._release(rid)  # (done by the cancel already; a no-op kept so this path never leaves KV counted)
            await link.send(Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(handoff.cancelled),
                                  request_id=rid))
            return
        await link.send(link.connection.kv_end(rid))

    async def _chunk_batches(self, handoff: HeldHandoff) -> AsyncGenerator[list[KvChunk], None]:
        """The hand-off's chunks: the ones made at `hold` on an idle link (dropped once taken: a resend makes
        them again), else a layer at a time off the loop, which the step timers share (handoff_frames.py). A
        streamed hand-off's segments each wait for their step to be planned (their KV exists from then on); one that
        found the link idle had its first layer made at `hold`, and its other layers are made on the loop, one per
        turn (`hold` says why)."""
        made, handoff.made = handoff.made, None
        eager, handoff.eager = handoff.eager, False
        frames, schedule = handoff.frames, handoff.schedule
        if made is not None:
            yield made
            if schedule is None:
                return
        for segment in range(frames.n_segments):
            if schedule is not None:
                await schedule.wait(segment)
            if handoff.cancelled:
                return
            for layer in range(1 if made is not None and segment == 0 else 0, frames.n_layers):
                release = schedule.release_ns(segment, layer) if schedule is not None else 0
                started = time.perf_counter()
                if eager:
                    chunks = frames.layer_chunks(layer, segment, release)
                else:
                    chunks = await asyncio.to_thread(frames.layer_chunks, layer, segment, release)
                self.make_s += time.perf_counter() - started
                yield chunks
                if eager:
                    await asyncio.sleep(0)  # one layer per turn: the step timer and the socket run between

    async def _acks(self, link: Endpoint) -> None:
        while (event := await link.next_event()) is not None:
            match event:
                case Ack():
                    handoff = self.held.get(event.request_id)
                    if handoff is None or handoff.attempts == 0:
                        continue  # a late or repeated Ack (we gave up, or it was a retry's): nothing held
                    self._release(event.request_id)
                    outcome = "ok" if event.status == AckStatus.OK else "failed"
                    self.acked[outcome] += 1
                    self.metrics.requests.labels(outcome=outcome).inc()
                    if outcome == "failed":
                        await self._tell_client(handoff, f"hand-off refused: {event.detail or 'no reason given'}")
                case Error(request_id=int(rid)):
                    handoff = self.held.get(rid)
                    if handoff is not None and handoff.attempts:
                        handoff.last_error = event.message
                        delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** handoff.attempts)
                        # A retry's backoff is housekeeping, not model time: the loop's timer (module docstring).
                        asyncio.get_running_loop().call_later(delay, self._enqueue, handoff)
                case Error():
                    log.warning("KV peer reported: %s", event.message)
                case Bye():
                    break
        raise ConnectionError(f"the KV link to {self.kv_to} closed")

    # -- outcomes ------------------------------------------------------------------------------------------

    def _release(self, request_id: int) -> None:
        self._held_bytes.pop(request_id, None)
        self.held.pop(request_id, None)
        self.metrics.kv_held_bytes.set(sum(self._held_bytes.values()))

    async def _give_up(self, handoff: HeldHandoff) -> None:
        """The hand-off missed its deadline: release its KV, count it failed, tell the client why."""
        self._release(handoff.request_id)
        self.given_up += 1
        self.acked["failed"] += 1
        self.metrics.requests.labels(outcome="failed").inc()
        reason = (f"hand-off gave up after {HANDOFF_DEADLINE_S:.0f} s and {handoff.attempts} attempt(s): "
                  f"{handoff.last_error or 'no Ack came back'}")
        log.warning("request %d: %s", handoff.request_id, reason)
        await self._tell_client(handoff, reason)

    @staticmethod
    async def _tell_client(handoff: HeldHandoff, reason: str) -> None:
        with contextlib.suppress(ConnectionError, ProtocolError, RuntimeError):
            await handoff.client.send(Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(reason),
                                            request_id=handoff.request_id))

    async def _expire(self) -> None:
        """Give up on held hand-offs past their deadline that are not being sent right now."""
        while True:
            await asyncio.sleep(EXPIRY_POLL_S)  # a housekeeping poll: the loop's timer (module docstring)
            now = self.clock.now_ns()
            for handoff in [h for h in self.held.values() if now >= h.deadline_ns]:
                if handoff is not self._sending and self.held.get(handoff.request_id) is handoff:
                    await self._give_up(handoff)

    # -- the connection ------------------------------------------------------------------------------------

    async def _connect(self) -> Endpoint:
        return await open_greeted(self.kv_to.host, self.kv_to.port, Role.PREFILL, Role.MIDDLEBOX, name=self.name,
                                  timeout_s=CONNECT_TIMEOUT_S)

    async def connect(self) -> None:
        """The first connection, retried until CONNECT_TIMEOUT_S (the middlebox may start after us)."""
        def give_up(exc: BaseException) -> Exception:
            return ConnectionError(f"cannot reach the middlebox at {self.kv_to} (--kv-to) after "
                                   f"{CONNECT_TIMEOUT_S:.0f} s: {exc}")

        self.link = await dial_within(self._connect, within_s=CONNECT_TIMEOUT_S, retry_s=BACKOFF_MIN_S * 4,
                                      retry_on=OSError, give_up=give_up)

    async def run(self) -> None:
        """Run the link (after `connect`) and the deadline watch; a failed link is dialled again, for ever."""
        assert self.link is not None, "connect() first"
        watch = TaskSet(f"{self.name} hand-offs")
        watch.spawn(self._expire(), "deadline watch")
        try:
            await self._sessions(self.link)
        finally:
            await watch.close()

    async def _sessions(self, link: Endpoint) -> None:
        while True:
            self.link = link
            # Plain tasks, not a TaskSet: each session ends by one of them failing (a lost link), which is
            # this loop's business to handle, not a failure to log.
            tasks = [asyncio.create_task(self._sender(link), name="KV sender"),
                     asyncio.create_task(self._acks(link), name="KV acks")]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                link.abort()
            error = next((t.exception() for t in done if not t.cancelled() and t.exception()), None)
            log.warning("KV link to %s lost (%s): reconnecting", self.kv_to, error)
            def not_yet(exc: BaseException) -> None:
                log.info("middlebox at %s not reachable yet: %s", self.kv_to, exc)

            redialled = await redial(self._connect, first_s=BACKOFF_MIN_S, max_s=BACKOFF_MAX_S,
                                     retry_on=(OSError, ProtocolError), on_retry=not_yet)
            assert redialled is not None  # wanted for ever: only a successful dial returns
            link = redialled
            for handoff in list(self.held.values()):
                if handoff.attempts:  # sent at least once and not acked: again
                    self._enqueue(handoff)

    async def close(self) -> None:
        if self.link is None:
            return
        await self.link.goodbye("prefill stopping")  # best effort on the way out
        self.link.abort()

    def stats(self) -> dict[str, Any]:
        return {
            "kv_sent_bytes": self.kv_sent_bytes,
            "acked": dict(self.acked),
            "held_requests": len(self._held_bytes),
            "handoff_retries": self.retries,
            "handoffs_given_up": self.given_up,
            "handoffs_cancelled": self.cancelled,
            "first_token_to_kv_begin_s": self.begin_lag_s,
        }
