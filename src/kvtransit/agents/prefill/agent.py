"""The prefill agent: one prefill instance (REFERENCE §4).

It takes Requests from the load generator, queues and batches them (`PrefillQueue`), holds each batch for
the roofline prefill time × dilation on absolute deadlines, sends each request's FirstToken at the end of its
step, then streams the request's KV (real bytes, per layer or ≤ 8 MiB piece of one) towards decode through
the middlebox, and keeps it until the Ack for that request comes back.

What a step holds and costs is planned by the pure `model.prefill_plan` (the roofline time from the cached and
computed tokens, the GPU codec with `compress_at="gpu"`, the energy); this file does the holding and the I/O.
The KV of a batch is generated (and, with `compress_at="gpu"`, encoded) while the step's timer runs, so the
host's real work overlaps the modelled GPU time; if it overruns, the step wakes late and the fidelity guard
sees it.

Steps are held on the injected `clock` (a ManualClock in tests). Housekeeping waits (reconnect backoff, the
hand-off expiry poll, a retry's delay) stay on the loop's own timer: on the clock they would count as step
wake-ups in the fidelity guard's lateness figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

from kvtransit.agents.common import kv_frames
from kvtransit.agents.common.process import Address, announce_ready, lateness_observer, listen, new_registry, start_http
from kvtransit.agents.common.request_ids import wire_id
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.fidelity import lateness_mean, lateness_p99
from kvtransit.model.prefill_plan import BatchEntry, codec_on_gpu, plan_prefill_step
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving import PrefillQueue, ServingRequest
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock, DeadlineSchedule, MonotonicClock
from kvtransit.runtime.tasks import GOODBYE_TIMEOUT_S, TaskSet
from kvtransit.runtime.transport import Endpoint, open_endpoint
from kvtransit.wire.errors import ErrorCode, ProtocolError
from kvtransit.wire.events import Ack, AckStatus, Bye, Error, FirstToken, Hello, KvBegin, Request, Role
from kvtransit.wire.limits import WIRE_VERSION, clip_message

from .prefix_cache import Lookup, PrefixReuse

log = logging.getLogger(__name__)

# Hand-off recovery. A hand-off not acked within this many wall seconds of its first send is given up, and
# the client is told why: no KV is held forever (30 s is far above a restart of the middlebox, ~1-2 s here,
# and a 2 s link outage, the chaos suite's faults). KVTRANSIT_HANDOFF_DEADLINE_S overrides it (tests).
HANDOFF_DEADLINE_S = float(os.environ.get("KVTRANSIT_HANDOFF_DEADLINE_S", "30"))
# Reconnecting to the middlebox, and retrying a hand-off whose attempt failed: exponential backoff.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
# How long the first connection to the middlebox may take at start-up (it may start after us, as decode
# may for the middlebox: compose).
CONNECT_TIMEOUT_S = 30.0
EXPIRY_POLL_S = 0.25


@dataclass
class _Pending:
    request: Request
    client: Endpoint
    frames: list = field(default_factory=list)  # the KV frames, made during the step
    held_bytes: int = 0
    # Recovery (see _kv_link_loop): the KV is held until an Ack; a failed attempt is sent again until then.
    deadline_ns: int = 0  # give up (with the reason) if still unacked at this time (set at the first token)
    attempts: int = 0  # sends begun
    last_error: str = ""
    queued: bool = False  # waiting in the send queue (never twice)


class PrefillAgent:
    def __init__(self, scenario: Scenario, *, name: str, listen: Address, kv_to: Address, metrics_listen: Address,
                 pool_via: Address | None = None, clock: Clock | None = None):
        """`pool_via`: the middlebox's pool port, for `--kv-pool pool` (prefix_cache.py). `clock`: what steps are
        held on (default: the monotonic clock, its wake-up lateness fed to the fidelity guard)."""
        self.scenario = scenario
        self.name = name
        self.listen_address, self.kv_to, self.metrics_listen = listen, kv_to, metrics_listen
        self.registry, shared = new_registry("prefill")
        self.metrics = runtime_metrics.prefill_metrics(self.registry)
        self.lateness: list[float] = []
        self.clock: Clock = clock if clock is not None else MonotonicClock(
            observe_lateness=lateness_observer(shared, "prefill", self.lateness))
        layout = scenario.kv_layout
        self.layout = layout
        self.kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed,
                              sample_path=scenario.kv_sample_path)
        self.gpu_codec = kv_frames.codec_for(scenario) if codec_on_gpu(scenario) else None
        # Prefix reuse (off by default): each request's lookup, kept until its step has run.
        self.prefix = (PrefixReuse(scenario, registry=self.registry, kv=self.kv, clock=self.clock, pool_via=pool_via,
                                   name=name) if scenario.kv_pool != "off" else None)
        self._lookups: dict[int, Lookup] = {}
        self._lookup_tasks = TaskSet("prefill lookups")
        self.queue = PrefillQueue()
        self._pending: dict[int, _Pending] = {}
        self._work = asyncio.Event()
        self._kv_out: asyncio.Queue[_Pending] = asyncio.Queue()
        self._held: dict[int, int] = {}  # request id → KV bytes held until acked
        self.kv_link: Endpoint | None = None
        self._sending: _Pending | None = None  # the hand-off whose frames are going out right now
        self.retries = 0
        self.given_up = 0
        # stats for /stats and the report
        self.steps = 0
        self.shortest_step_wall_s = float("inf")
        self.gpu_energy_j = 0.0
        self.kv_sent_bytes = 0
        self.acked = {"ok": 0, "failed": 0}
        self.host_kv_s = 0.0  # real time spent making (and encoding) KV
        self.begin_lag_s = 0.0  # first token → KvBegin written, summed: the sender's share of the hand-off

    # -- the loadgen side --------------------------------------------------------------------------------

    async def _serve_client(self, endpoint: Endpoint) -> None:
        await endpoint.send(Hello(role=Role.PREFILL, version=WIRE_VERSION, name=self.name))
        while (event := await endpoint.next_event()) is not None:
            if isinstance(event, Request):
                self._pending[event.request_id] = _Pending(event, endpoint)
                if self.prefix is not None:  # look up (and fetch) its cached prefix first: TTFT pays for it
                    self._lookup_tasks.spawn(self._admit_after_lookup(self.prefix, event),
                                             f"lookup {event.request_id}")
                    continue
                self.queue.push(ServingRequest(event.request_id, event.prompt_tokens, event.output_tokens))
                self.metrics.queued_tokens.set(self.queue.queued_tokens)
                self._work.set()
            elif isinstance(event, Bye):
                break

    async def _admit_after_lookup(self, prefix: PrefixReuse, request: Request) -> None:
        try:
            lookup = await prefix.lookup(request)
        except Exception:  # a bug in the lookup must cost the request its reuse, never the request itself
            log.exception("prefix lookup of request %d failed; computing it whole", request.request_id)
            lookup = prefix.recompute(request)
        self._lookups[request.request_id] = lookup
        # The batch budget counts the tokens the step computes (the cached ones are only re-read).
        self.queue.push(ServingRequest(request.request_id, request.prompt_tokens - lookup.cached_tokens,
                                       request.output_tokens))
        self.metrics.queued_tokens.set(self.queue.queued_tokens)
        self._work.set()

    # -- the step loop -----------------------------------------------------------------------------------

    def _batch_entry(self, request_id: int) -> BatchEntry:
        request = self._pending[request_id].request
        cached = self._lookups[request_id].cached_tokens if self.prefix is not None else 0
        return BatchEntry(request_id, request.prompt_tokens, request.output_tokens, cached)

    async def _step_loop(self) -> None:
        schedule: DeadlineSchedule | None = None  # None: idle, the next step starts now
        while True:
            if not len(self.queue):
                schedule = None
                self._work.clear()
                await self._work.wait()
                continue
            batch = self.queue.take_batch()
            self.metrics.queued_tokens.set(self.queue.queued_tokens)
            plan = plan_prefill_step(self.scenario, [self._batch_entry(wire_id(r.request_id)) for r in batch])
            # Back-to-back steps chain on deadlines (step k due at t0 + Σ durations, so a late wake-up is not
            # carried into the next step); after idling, from now.
            schedule = schedule or DeadlineSchedule(self.clock)
            deadline_ns = schedule.add(plan.wall_s)
            # An Ack may release one from _pending while the step runs.
            pendings = {e.request_id: self._pending[wire_id(e.request_id)] for e in plan.entries}
            started = time.perf_counter()
            for entry in plan.handoffs:  # the host's real work overlaps the modelled step
                self._stage_handoff(pendings[entry.request_id], deadline_ns)
            self.host_kv_s += time.perf_counter() - started
            await self.clock.sleep_until(deadline_ns)
            self.steps += 1
            self.shortest_step_wall_s = min(self.shortest_step_wall_s, plan.wall_s)
            self.metrics.step_seconds.observe(plan.model_s)
            self.gpu_energy_j += plan.energy_j
            self.metrics.gpu_energy_joules.inc(plan.energy_j)
            t_ns = self.clock.now_ns()
            if self.prefix is not None:  # the blocks this step computed go to the cache, in the background
                for entry in plan.entries:
                    rid = wire_id(entry.request_id)
                    self.prefix.write_back(rid, self._lookups.pop(rid))
            for entry in plan.entries:
                await self._first_token(pendings[entry.request_id], t_ns)
                if not entry.hands_off:  # nothing to decode: done at prefill (as in the simulator)
                    self._pending.pop(wire_id(entry.request_id), None)
                    self.metrics.requests.labels(outcome="ok").inc()

    def _stage_handoff(self, pending: _Pending, first_token_ns: int) -> None:
        """The hand-off starts at the first token, the end of this step (REFERENCE §4). The KV goes to the
        middlebox now, stamped with that time, and the middlebox holds it until then: the host's own cost of
        producing, framing and relaying the bytes overlaps the modelled step instead of landing on the hand-off
        (which a kernel shaper, tc, could never win back)."""
        self._make_frames(pending, first_token_ns)
        pending.deadline_ns = first_token_ns + round(HANDOFF_DEADLINE_S * 1e9)
        self._enqueue(pending)

    async def _first_token(self, pending: _Pending, t_ns: int) -> None:
        try:
            await pending.client.send(FirstToken(request_id=pending.request.request_id, t_ns=t_ns))
        except (ConnectionError, RuntimeError) as exc:
            log.warning("could not send first token of request %d: %s", pending.request.request_id, exc)

    def _make_frames(self, pending: _Pending, first_token_ns: int) -> None:
        request, layout = pending.request, self.layout
        tokens = request.prompt_tokens
        rows_per_layer = 2 * layout.kv_heads
        row_bytes = tokens * layout.head_dim * layout.bytes_per_value
        pieces = kv_frames.row_slices(layout.layers, rows_per_layer, row_bytes)
        layers = [kv_frames.as_rows(self.kv.layer(request.request_id, layer, tokens)) for layer in range(layout.layers)]
        codec_name = self.scenario.codec if self.gpu_codec is not None else "none"
        codec = self.gpu_codec
        if codec is not None and tokens < self.scenario.sinks:
            codec = kv_frames.codec_for(self.scenario, tokens)
        frames = []
        for index, piece in enumerate(pieces):
            rows = layers[piece.layer]
            if codec is None:
                frames.append(kv_frames.raw_chunk(request.request_id, index, piece, rows))
            else:
                frames.append(kv_frames.encoded_chunk(request.request_id, index, piece, rows, codec, codec_name))
        begin = KvBegin(request_id=request.request_id, prompt_tokens=tokens, output_tokens=request.output_tokens,
                        n_layers=layout.layers, n_chunks=len(frames), raw_bytes=layout.request_bytes(tokens),
                        codec=codec_name, first_token_ns=first_token_ns)
        pending.frames = [begin, *frames]
        pending.held_bytes = sum(len(f.payload) for f in frames)

    # -- the KV side -------------------------------------------------------------------------------------

    def _enqueue(self, pending: _Pending) -> None:
        if not pending.queued:
            pending.queued = True
            self._kv_out.put_nowait(pending)

    async def _kv_sender(self, link: Endpoint) -> None:
        """One request's KV after another, in FIFO order (the hand-off link is a FIFO, REFERENCE §4)."""
        while True:
            pending = await self._kv_out.get()
            pending.queued = False
            rid = pending.request.request_id
            if self._pending.get(rid) is not pending:
                continue  # acked or given up while it waited
            if self.clock.now_ns() >= pending.deadline_ns:
                await self._give_up(pending)
                continue
            begin, *chunks = pending.frames
            self._held[rid] = pending.held_bytes
            self.metrics.kv_held_bytes.set(sum(self._held.values()))
            pending.attempts += 1
            if pending.attempts > 1:
                self.retries += 1
                self.metrics.handoff_retries.inc()
            self._sending = pending
            try:
                # Bounded by the hand-off's deadline: a middlebox that stops reading (TCP back-pressure)
                # must not hold this KV, or the ones queued behind it, forever.
                remaining_s = max(0.0, (pending.deadline_ns - self.clock.now_ns()) / 1e9)
                await asyncio.wait_for(self._send_frames(link, pending, begin, chunks), remaining_s)
            except TimeoutError:
                pending.last_error = f"the middlebox at {self.kv_to} took no more bytes (stalled mid-stream)"
                await self._give_up(pending)
                # Its stream is cut mid-frame: the connection cannot carry anything more. The middlebox sees it
                # close and drops the partial stream; the other held hand-offs go again on a new connection.
                raise ConnectionError(f"request {rid} stalled mid-stream past its deadline") from None
            except (ConnectionError, ProtocolError) as exc:
                pending.last_error = f"KV link to the middlebox at {self.kv_to} failed: {exc}"
                raise  # the session ends; the hand-off is held and goes again on the next connection
            finally:
                self._sending = None
            # The KV stays held (pending.frames) until the decode side's Ack releases it.

    async def _send_frames(self, link: Endpoint, pending: _Pending, begin: KvBegin, chunks: list) -> None:
        await link.send(begin)
        if pending.attempts == 1:
            self.begin_lag_s += (self.clock.now_ns() - begin.first_token_ns) / 1e9
        for chunk in chunks:
            await link.send(chunk)
            if pending.attempts == 1:
                self.kv_sent_bytes += len(chunk.payload)
                self.metrics.kv_sent_bytes.labels(codec=begin.codec).inc(len(chunk.payload))
        await link.send(link.connection.kv_end(pending.request.request_id))

    async def _kv_acks(self, link: Endpoint) -> None:
        while (event := await link.next_event()) is not None:
            if isinstance(event, Ack):
                pending = self._pending.get(event.request_id)
                if pending is None or pending.attempts == 0:
                    continue  # a late or repeated Ack (we gave up, or it was a retry's): nothing held
                self._release(event.request_id)
                ok = event.status == AckStatus.OK
                outcome = "ok" if ok else "failed"
                self.acked[outcome] += 1
                self.metrics.requests.labels(outcome=outcome).inc()
                if not ok:  # refused for good (decode cannot hold it, the kernel refused it): tell the client
                    await self._tell_client(pending, f"hand-off refused: {event.detail or 'no reason given'}")
            elif isinstance(event, Error) and event.request_id is not None:
                # This attempt did not get through (the link to decode or decode itself failed behind the
                # middlebox): send it again after a backoff, until the deadline.
                pending = self._pending.get(event.request_id)
                if pending is not None and pending.attempts:
                    pending.last_error = event.message
                    delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** pending.attempts)
                    asyncio.get_running_loop().call_later(delay, self._enqueue, pending)
            elif isinstance(event, Error):
                log.warning("KV peer reported: %s", event.message)
            elif isinstance(event, Bye):
                break
        raise ConnectionError(f"the KV link to {self.kv_to} closed")

    def _release(self, request_id: int) -> None:
        self._held.pop(request_id, None)
        self._pending.pop(request_id, None)
        self.metrics.kv_held_bytes.set(sum(self._held.values()))

    async def _give_up(self, pending: _Pending) -> None:
        """The hand-off missed its deadline: release its KV, count it failed, tell the client why."""
        rid = pending.request.request_id
        self._release(rid)
        self.given_up += 1
        self.acked["failed"] += 1
        self.metrics.requests.labels(outcome="failed").inc()
        reason = (f"hand-off gave up after {HANDOFF_DEADLINE_S:.0f} s and {pending.attempts} attempt(s): "
                  f"{pending.last_error or 'no Ack came back'}")
        log.warning("request %d: %s", rid, reason)
        await self._tell_client(pending, reason)

    async def _tell_client(self, pending: _Pending, reason: str) -> None:
        with contextlib.suppress(ConnectionError, ProtocolError, RuntimeError):
            await pending.client.send(Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(reason),
                                            request_id=pending.request.request_id))

    async def _expire(self) -> None:
        """Give up on held hand-offs past their deadline that are not being sent right now (a dead middlebox
        would otherwise hold them until it came back)."""
        while True:
            await asyncio.sleep(EXPIRY_POLL_S)
            now = self.clock.now_ns()
            for pending in [p for p in self._pending.values() if p.deadline_ns and now >= p.deadline_ns]:
                if pending is not self._sending and self._pending.get(pending.request.request_id) is pending:
                    await self._give_up(pending)

    async def _connect_kv(self) -> Endpoint:
        link = await open_endpoint(self.kv_to.host, self.kv_to.port, Role.PREFILL, Role.MIDDLEBOX)
        try:
            await link.send(Hello(role=Role.PREFILL, version=WIRE_VERSION, name=self.name))
            first = await asyncio.wait_for(link.next_event(), CONNECT_TIMEOUT_S)
        except BaseException:
            link.abort()
            raise
        if not isinstance(first, Hello):
            link.abort()
            raise ConnectionError(f"the KV peer at {self.kv_to} did not say Hello (got {first!r})")
        return link

    async def _kv_link_loop(self, link: Endpoint) -> None:
        """Run the KV link; when it fails (the middlebox died, the link reset), reconnect with backoff and send
        every held, unacked hand-off again, oldest first. Decode drops what it already has and acks it."""
        delay = BACKOFF_MIN_S
        while True:
            self.kv_link = link
            tasks = [asyncio.create_task(self._kv_sender(link)), asyncio.create_task(self._kv_acks(link))]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                link.abort()
            error = next((t.exception() for t in done if not t.cancelled() and t.exception()), None)
            log.warning("KV link to %s lost (%s): reconnecting", self.kv_to, error)
            while True:
                await asyncio.sleep(delay)
                try:
                    link = await self._connect_kv()
                except (TimeoutError, OSError, ConnectionError, ProtocolError) as exc:
                    delay = min(BACKOFF_MAX_S, delay * 2)
                    log.info("middlebox at %s not reachable yet: %s", self.kv_to, exc)
                    continue
                delay = BACKOFF_MIN_S
                break
            for pending in list(self._pending.values()):
                if pending.attempts:  # sent at least once and not acked: again
                    self._enqueue(pending)

    # -- stats ---------------------------------------------------------------------------------------------

    def stats(self) -> dict:
        return {
            "role": "prefill",
            "name": self.name,
            "steps": self.steps,
            "gpu_energy_j": self.gpu_energy_j,
            "kv_sent_bytes": self.kv_sent_bytes,
            "acked": dict(self.acked),
            "held_requests": len(self._held),
            "handoff_retries": self.retries,
            "handoffs_given_up": self.given_up,
            "timer_lateness_p99_s": lateness_p99(self.lateness),
            "timer_lateness_mean_s": lateness_mean(self.lateness),
            "timer_wakeups": len(self.lateness),
            "shortest_step_wall_s": self.shortest_step_wall_s if self.steps else None,
            "host_kv_s": self.host_kv_s,
            "first_token_to_kv_begin_s": self.begin_lag_s,
            **({"prefix": self.prefix.stats()} if self.prefix is not None else {}),
        }

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def _first_connect(self) -> Endpoint:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_TIMEOUT_S
        while True:
            try:
                return await self._connect_kv()
            except (OSError, ConnectionError) as exc:
                if loop.time() >= deadline:
                    raise ConnectionError(f"cannot reach the middlebox at {self.kv_to} (--kv-to) after "
                                          f"{CONNECT_TIMEOUT_S:.0f} s: {exc}") from None
                await asyncio.sleep(BACKOFF_MIN_S * 4)

    async def run(self, stop: asyncio.Event) -> None:
        self.kv_link = await self._first_connect()
        server = await listen(self.listen_address, "--listen", self._serve_client, Role.PREFILL, Role.LOADGEN)
        http = await start_http(self.metrics_listen, self.registry, self.stats)
        announce_ready("prefill", self.name, listen_port=server.port, metrics_port=http.port)
        loops = TaskSet("prefill")
        for name, coro in (("step loop", self._step_loop()), ("kv link", self._kv_link_loop(self.kv_link)),
                           ("hand-off deadlines", self._expire()), ("stop", stop.wait())):
            loops.spawn(coro, name)
        try:
            done, _ = await asyncio.wait(list(loops), return_when=asyncio.FIRST_COMPLETED)
            for task in done:  # a loop only ends by failing; the stop task ends cleanly
                if (failure := task.exception()) is not None:
                    raise failure
        finally:
            await loops.close()
            await self._lookup_tasks.close()
            with contextlib.suppress(Exception):  # best effort on the way out
                await asyncio.wait_for(self.kv_link.send(Bye(reason="prefill stopping")), GOODBYE_TIMEOUT_S)
            self.kv_link.abort()
            if self.prefix is not None:
                await self.prefix.close()
            await server.shutdown(1.0)
            await http.close()
