"""The load generator: replays the scenario's workload and measures what a client sees (docs/reference.md §4).

- The request stream is `workload_source.requests_for(scenario)`: `model.workload.generate` of the scenario's
  workload (the same seed gives the simulator's requests, arrival for arrival), or a trace replayed.
- Open loop: request k is sent at t0 + its arrival time (× dilation) on an absolute deadline, whatever is
  in flight; with `max_concurrency` > 0 it also waits for a free slot (its arrival is then when it was sent).
- Routing to prefill instances is here (`PrefillRouter`: fewest queued prompt tokens), since the load
  generator knows what it sent where.
- Every request ends with an outcome: ok, slo-miss, failed (with the reason a peer gave, or the connection
  that was lost), or timed out (the drain deadline passed). None vanish.
- A request can be `withdraw`n (the OpenAI front end's client went away): it fails with the reason at once, and
  an Error naming it tells its prefill and decode to drop it (docs/WIRE.md), so its KV is released early.

Times: token arrivals are stamped on receipt at the client; "KV ready" is decode's stamp (a Tokens entry
with index 0); the first token's producer stamp (prefill) is kept for the hand-off. All on the host's shared
CLOCK_MONOTONIC (the injected `clock`: a MonotonicClock, or a ManualClock in tests), reported in model seconds
(÷ dilation). Decode's queue wait (KV ready → admitted) is read from each decode once the run is over
(`agents/common/queue_waits.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtransit.agents.common.queue_waits import QUEUE_WAITS_PATH, parse_handoff_splits, parse_queue_waits
from kvtransit.agents.loadgen.ledger_writer import LedgerWriter
from kvtransit.agents.loadgen.model_accuracy_wait import wait_for_models, wait_for_readings
from kvtransit.agents.process import Address, announce_ready, new_registry, start_http
from kvtransit.model.judge.ledger_check import LEDGER_FILE
from kvtransit.model.judge.ledger_check import read as ledger_check
from kvtransit.model.judge.slo import RequestRecord, percentile
from kvtransit.model.scenario import REAL_MODEL_KV, Scenario
from kvtransit.model.serving.policies import PrefillRouter, ServingRequest
from kvtransit.model.serving.workload import RequestSpec
from kvtransit.report import build as run_report
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime.clock import Clock, MonotonicClock, sleep_for
from kvtransit.runtime.http_client import get_json
from kvtransit.runtime.redial import redial
from kvtransit.runtime.tasks import TaskSet
from kvtransit.runtime.transport import Endpoint, open_greeted
from kvtransit.wire.errors import ErrorCode, ProtocolError
from kvtransit.wire.events import Bye, Error, FirstToken, Request, Role, Tokens
from kvtransit.wire.limits import clip_message
from kvtransit.workload.source import new_record, requests_for

log = logging.getLogger(__name__)

# How long after the last arrival the run waits for stragglers before calling them timed out, at least, in
# model seconds; the actual allowance also grows with the run's own length (see `drain_timeout_s`).
MIN_DRAIN_S = 30.0

Progress = Callable[[dict], None]
# A decode instance that went away (restarted) is dialled again this often, doubling up to the max.
RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 1.0
# How often the live progress callback is given a snapshot: twice a second is smooth enough for a progress bar.
PROGRESS_EVERY_S = 0.5


class LoadGenerator:
    def __init__(self, scenario: Scenario, *, name: str, prefills: list[Address], decodes: list[Address],
                 metrics_listen: Address, stats_from: Sequence[Address] = (), report_path: Path | None = None,
                 drain_timeout_s: float | None = None, progress: Progress | None = None,
                 ledger_path: Path | None = None, clock: Clock | None = None):
        """`ledger_path`: the request ledger (ledger_writer.py); default `ledger.jsonl` in the run directory
        beside the report (REPORT.run/, the launcher's default run dir). `clock`: what sends are timed on and
        arrivals stamped with (default: the monotonic clock)."""
        self.scenario = scenario
        self.name = name
        self.prefill_addresses, self.decode_addresses = list(prefills), list(decodes)
        self.metrics_listen = metrics_listen
        self.stats_from = list(stats_from)
        self.report_path = report_path
        self.registry, _ = new_registry("loadgen")
        self.metrics = runtime_metrics.loadgen_metrics(self.registry)
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.workload = requests_for(scenario)
        self.records: dict[int, RequestRecord] = {}
        self.handoff_splits: dict[int, dict] = {}  # request id → decode's hand-off split (exposed_s, hidden_s, ...)
        self.router = PrefillRouter(len(prefills))
        self.tokens_delivered = 0
        # Tokens that came before an earlier token of their request, held until it came (see `_token`).
        self._overtaking: dict[int, set[int]] = {}
        self.tokens_overtaking = 0
        last_arrival = self.workload[-1].arrival_s if self.workload else 0.0
        self.drain_timeout_s = drain_timeout_s if drain_timeout_s is not None else max(MIN_DRAIN_S, last_arrival)
        self.progress = progress
        if ledger_path is None and report_path is not None:
            ledger_path = Path(report_path).with_suffix(".run") / LEDGER_FILE
        self.ledger_path = ledger_path
        self.ledger: LedgerWriter | None = None
        self._running = False
        self._t0_ns = 0
        self._open: set[int] = set()  # sent, not yet finished or failed
        self._all_sent = False
        self._done = asyncio.Event()
        self._slots: asyncio.Semaphore | None = (asyncio.Semaphore(scenario.max_concurrency)
                                                 if scenario.max_concurrency else None)
        self._prefill_of: dict[int, int] = {}
        self._decode_of: dict[int, int] = {}
        # The connections of the run being driven (`drive`), and the withdrawals going out on them.
        self._links: tuple[list[Endpoint], list[Endpoint]] = ([], [])
        self._withdrawals = TaskSet("withdrawals")

    # -- times ---------------------------------------------------------------------------------------------

    def _model_s(self, t_ns: int) -> float:
        """A monotonic stamp as model seconds since the run's start."""
        return self.scenario.model_s((t_ns - self._t0_ns) / 1e9)

    # -- outcomes --------------------------------------------------------------------------------------------

    def _settle(self, request_id: int) -> None:
        """The request is over (finished or failed): count it, free its slot."""
        if request_id not in self._open:
            return
        self._open.discard(request_id)
        self._overtaking.pop(request_id, None)
        if self._slots is not None:
            self._slots.release()
        record = self.records[request_id]
        self.metrics.requests.labels(outcome=record.outcome.value).inc()
        if self.ledger is not None:
            self.ledger.outcome(request_id, record.outcome.value, record.failure)
        if record.finished:
            ttft_s, e2e_s = record.ttft_s, record.e2e_s
            # Settled as finished only from _token, after a token arrived: both ends of the request are known.
            assert ttft_s is not None and e2e_s is not None
            self.metrics.ttft_seconds.observe(ttft_s)
            self.metrics.e2e_seconds.observe(e2e_s)
            if record.tpot_s is not None:
                self.metrics.tpot_seconds.observe(record.tpot_s)
            for gap in record.itl_s:
                self.metrics.itl_seconds.observe(gap)
        if record.handoff_s is not None:
            self.metrics.handoff_seconds.labels(phase="total").observe(record.handoff_s)
        self.metrics.in_flight.set(len(self._open))
        self._on_settled(record)
        if self._all_sent and not self._open:
            self._done.set()

    # Hooks for a subclass that serves the requests' clients itself (the OpenAI front end): no-ops here.
    def _on_token(self, record: RequestRecord, index: int) -> None:
        """Token `index` of an open request arrived (its time is `record.token_times_s[index]`)."""

    def _on_settled(self, record: RequestRecord) -> None:
        """The request is over (its outcome is recorded and counted)."""

    def _amend_report(self, report: dict) -> None:
        """Add to the run report before it is written."""

    def _fail(self, request_id: int, reason: str) -> None:
        record = self.records.get(request_id)
        if record is None or request_id not in self._open:
            return
        record.failure = reason
        self.router.complete(request_id)
        self._settle(request_id)

    def withdraw(self, request_id: int, reason: str) -> None:
        """Fail an open request as `reason` and tell its prefill and decode (the one holding its KV, or every
        decode while none has said so) to drop it: an Error naming it. Called where nothing may wait (a client's
        connection closing), so the Errors go out in the background, before the run's Byes."""
        if request_id not in self._open:
            return
        self._fail(request_id, reason)
        prefills, decodes = self._links
        targets = [prefills[self._prefill_of[request_id]]] if prefills else []
        held_by = self._decode_of.get(request_id)
        targets += [decodes[held_by]] if held_by is not None else list(decodes)
        error = Error(code=ErrorCode.REQUEST_FAILED, message=clip_message(reason), request_id=request_id)
        for endpoint in targets:
            self._withdrawals.spawn(self._tell(endpoint, error), f"withdraw request {request_id}")

    @staticmethod
    async def _tell(endpoint: Endpoint, error: Error) -> None:
        # Best effort: a peer that is gone has dropped the request with its connection.
        with contextlib.suppress(ConnectionError, ProtocolError, RuntimeError):
            await endpoint.send(error)

    def _token(self, request_id: int, index: int, t_ns: int) -> None:
        """Token `index` of a request arrived at `t_ns`. The first token comes from the prefill and the rest from
        decode, on two connections, so a later token can overtake an earlier one (a prefill process that wakes
        late on a busy host sends its first token after decode's first step). A streaming client shows tokens in
        order: one that overtook is held and delivered when the last one before it arrives, at that time. A token
        that comes twice fails its request."""
        record = self.records.get(request_id)
        if record is None or request_id not in self._open:
            return
        expected = len(record.token_times_s)
        held = self._overtaking.get(request_id)  # None for nearly every request: nothing made per token
        if index < expected or (held is not None and index in held):
            self._fail(request_id, f"token {index} arrived twice")
            return
        if index > expected:
            self._overtaking.setdefault(request_id, set()).add(index)
            self.tokens_overtaking += 1
            return
        while True:
            record.token_times_s.append(self._model_s(t_ns))
            self.tokens_delivered += 1
            self._on_token(record, index)
            index += 1
            if held is None or index not in held:
                break
            held.discard(index)
        if held is not None and not held:
            del self._overtaking[request_id]
        if record.finished:
            self._settle(request_id)

    # -- readers ---------------------------------------------------------------------------------------------

    async def _read_prefill(self, index: int, endpoint: Endpoint) -> None:
        try:
            while (event := await endpoint.next_event()) is not None:
                if isinstance(event, FirstToken):
                    rid = event.request_id
                    self.router.complete(rid)
                    record = self.records.get(rid)
                    if record is not None:
                        record.first_token_stamp_s = self._model_s(event.t_ns)
                    if self.ledger is not None:
                        self.ledger.tokens(f"prefill-{index}", [(rid, 0)])
                    self._token(rid, 0, self.clock.now_ns())
                elif isinstance(event, Error):
                    self._peer_error("prefill", index, event)
                elif isinstance(event, Bye):
                    break
        finally:
            waiting = [r for r in self._open if self._prefill_of.get(r) == index and not self.records[r].token_times_s]
            for rid in waiting:
                self._fail(rid, f"prefill {self.prefill_addresses[index]} connection lost")

    def _peer_error(self, peer: str, index: int, event: Error) -> None:
        """An Error from a prefill or decode: it fails the request it names, or is only logged."""
        if event.request_id is not None:
            self._fail(event.request_id, event.message)
        else:
            log.warning("%s %d reported: %s", peer, index, event.message)

    async def _read_decode(self, index: int, endpoint: Endpoint) -> None:
        try:
            while (event := await endpoint.next_event()) is not None:
                if isinstance(event, Tokens):
                    now = self.clock.now_ns()
                    self._ledger_tokens(index, event)
                    for entry in event.entries:
                        if entry.token_index == 0:  # decode holds the KV: the hand-off is over
                            record = self.records.get(entry.request_id)
                            if record is not None:
                                record.kv_ready_s = self._model_s(entry.t_ns)
                                self._decode_of[entry.request_id] = index
                        else:
                            self._token(entry.request_id, entry.token_index, now)
                elif isinstance(event, Error):
                    self._peer_error("decode", index, event)
                elif isinstance(event, Bye):
                    break
        finally:
            lost = f"decode {self.decode_addresses[index]} connection lost"
            for rid in [r for r in self._open if self._decode_of.get(r) == index]:
                self._fail(rid, lost)

    def _ledger_tokens(self, index: int, event: Tokens) -> None:
        """Every entry as received, before any filtering here: the ledger is the raw history."""
        if self.ledger is None:
            return
        source = f"decode-{index}"
        for entry in event.entries:
            if entry.token_index == 0:
                self.ledger.kv_ready(entry.request_id, source)
        self.ledger.tokens(source, [(e.request_id, e.token_index) for e in event.entries if e.token_index])

    async def _follow_decode(self, index: int, endpoint: Endpoint, endpoints: list[Endpoint]) -> None:
        """Read a decode instance's tokens; when it goes away (a restart), reconnect while the run is on."""
        address = self.decode_addresses[index]

        def not_back(exc: BaseException) -> None:
            log.info("decode %s not back yet: %s", address, exc)

        while True:
            await self._read_decode(index, endpoint)
            redialled = await redial(lambda: self._connect(address, Role.DECODE), first_s=RECONNECT_MIN_S,
                                     max_s=RECONNECT_MAX_S, retry_on=OSError, on_retry=not_back,
                                     wanted=lambda: self._running)
            if redialled is None:
                return
            endpoints[index] = endpoint = redialled

    # -- the run ---------------------------------------------------------------------------------------------

    async def _connect(self, address: Address, their_role: Role) -> Endpoint:
        return await open_greeted(address.host, address.port, Role.LOADGEN, their_role, name=self.name)

    async def _dispatch(self, prefills: list[Endpoint]) -> None:
        """The send schedule: every request of the workload at its arrival. (The OpenAI front end,
        agents/frontend/bridge.py, replaces it: its requests arrive from outside.)"""
        for spec in self.workload:
            deadline = self._t0_ns + round(self.scenario.wall_s(spec.arrival_s) * 1e9)
            await self.clock.sleep_until(deadline)
            await self.send_request(prefills, spec)
        self._all_sent = True
        if not self._open:
            self._done.set()

    async def send_request(self, prefills: list[Endpoint], spec: RequestSpec, *, arrival_ns: int | None = None) -> None:
        """Send one request (after a free slot, with `max_concurrency`) to the prefill the router picks, and open
        its record. `arrival_ns`: when its client asked, if that was before it could be sent (default: the send,
        as for the workload, whose requests arrive as they are sent)."""
        if self._slots is not None:
            await self._slots.acquire()
        request = ServingRequest(spec.request_id, spec.prompt_tokens, spec.output_tokens)
        instance = self.router.assign(request)
        sent_ns = self.clock.now_ns()
        arrived_ns = sent_ns if arrival_ns is None else arrival_ns
        self.records[spec.request_id] = new_record(self.scenario, spec, self._model_s(arrived_ns))
        self._open.add(spec.request_id)
        self._prefill_of[spec.request_id] = instance
        if self.ledger is not None:
            self.ledger.sent(spec.request_id, spec.output_tokens, instance)
        self.metrics.in_flight.set(len(self._open))
        try:
            await prefills[instance].send(Request(request_id=spec.request_id, prompt_tokens=spec.prompt_tokens,
                                                  output_tokens=spec.output_tokens, sent_ns=sent_ns,
                                                  hash_ids=spec.hash_ids))
        except (ConnectionError, RuntimeError) as exc:
            self._fail(spec.request_id, f"could not send to prefill {self.prefill_addresses[instance]}: {exc}")

    async def _report_progress(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)  # a display refresh, not model time: the loop's timer
            if self.progress is not None:
                self.progress(self.snapshot())

    def snapshot(self) -> dict:
        """Progress so far (the launcher's live bar polls it as /stats)."""
        ttfts = [r.ttft_s for r in self.records.values() if r.ttft_s is not None]
        tpots = [r.tpot_s for r in self.records.values() if r.tpot_s is not None]
        return {"role": "loadgen", "total": len(self.workload), "sent": len(self.records),
                "in_flight": len(self._open), "done": len(self.records) - len(self._open),
                "ttft_p99_s": percentile(ttfts, 99) if ttfts else None,
                "tpot_p99_s": percentile(tpots, 99) if tpots else None}

    async def collect_stats(self) -> tuple[list[dict], list[str]]:
        """Every peer's /stats, and one error per peer that gave none: the report names them and the run is not
        faithful (what they measured is missing from it)."""
        stats, missing = [], []
        for address in self.stats_from:
            try:
                stats.append(await get_json(address.host, address.port, "/stats"))
            except (TimeoutError, OSError, ConnectionError, ValueError) as exc:
                log.warning("no stats from %s: %s", address, exc)
                missing.append(f"no stats from {address.host}:{address.port}: {exc}")
                continue
            if stats[-1].get("role") == "decode":
                await self._read_queue_waits(address)
        return stats, missing

    async def _read_queue_waits(self, address: Address) -> None:
        """Decode's queue wait of every request it admitted, into the records. Not having them costs only the
        report's `kv_wait_share` (it counts the requests that have one), so a failure is a warning."""
        try:
            body = await get_json(address.host, address.port, QUEUE_WAITS_PATH)
            waits = parse_queue_waits(body)
            splits = parse_handoff_splits(body)  # each request's exposed / hidden hand-off, beside its wait
        except (TimeoutError, OSError, ConnectionError, ValueError) as exc:
            log.warning("no decode queue waits from %s: %s", address, exc)
            return
        self.handoff_splits.update(splits)
        for request_id, wait_s in waits.items():
            if (record := self.records.get(request_id)) is not None:
                record.decode_wait_s = wait_s

    async def run(self, stop: asyncio.Event | None = None) -> dict:
        """The whole run: dial every peer, `drive` the workload through them, then build (and write) the report."""
        stop = stop or asyncio.Event()
        http = await start_http(self.metrics_listen, self.registry, self.snapshot)
        if self.ledger_path is not None:
            self.ledger = LedgerWriter(self.ledger_path, clock=self.clock)
        prefills = [await self._connect(a, Role.PREFILL) for a in self.prefill_addresses]
        decodes = [await self._connect(a, Role.DECODE) for a in self.decode_addresses]
        announce_ready("loadgen", self.name, metrics_port=http.port)
        try:
            if self.scenario.kv_sample == REAL_MODEL_KV:  # decode's real model loads before the workload starts
                await wait_for_models(self.stats_from, self.clock)
            run_wall_s = await self.drive(prefills, decodes, stop)
            return await self._build_report(run_wall_s)
        finally:
            for endpoint in [*prefills, *decodes]:  # `decodes` holds the reconnected ones too
                endpoint.abort()
            await http.close()

    async def drive(self, prefills: list[Endpoint], decodes: list[Endpoint], stop: asyncio.Event) -> float:
        """Send the workload over greeted connections on its schedule (t0 = now) and read what comes back, until
        every request is over, the drain allowance after the last send has passed, or `stop` is set; then every
        request still open is timed out and each peer is told Bye. Returns the run's wall seconds.

        `decodes` is updated in place when a decode instance is dialled again; the caller closes the connections."""
        self._running = True
        self._t0_ns = self.clock.now_ns()
        self._links = (prefills, decodes)
        readers = TaskSet(f"{self.name} readers")
        for i, endpoint in enumerate(prefills):
            readers.spawn(self._read_prefill(i, endpoint), f"prefill {i}")
        for i, endpoint in enumerate(decodes):
            readers.spawn(self._follow_decode(i, endpoint, decodes), f"decode {i}")
        schedule = TaskSet(f"{self.name} schedule")
        try:
            schedule.spawn(self._report_progress(), "progress")
            stopped = schedule.spawn(stop.wait(), "stop")
            dispatch = schedule.spawn(self._dispatch(prefills), "send schedule")
            await asyncio.wait([dispatch, stopped], return_when=asyncio.FIRST_COMPLETED)
            if dispatch.done() and (failure := dispatch.exception()) is not None:
                raise failure
            if not stop.is_set():
                # The drain allowance is model seconds (× dilation), so it runs on the injected clock.
                drained = schedule.spawn(self._done.wait(), "all requests over")
                allowance = schedule.spawn(sleep_for(self.clock, self.scenario.wall_s(self.drain_timeout_s)),
                                           "drain allowance")
                await asyncio.wait([drained, allowance, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._running = False
            await schedule.close()  # nothing is sent from here on
            run_wall_s = (self.clock.now_ns() - self._t0_ns) / 1e9
            for rid in list(self._open):  # the deadline passed (or the run was stopped) with these unfinished
                self.records[rid].timed_out = True
                self._settle(rid)
            await self._withdrawals.close(grace_s=1.0)  # an Error cannot follow the Bye
            for endpoint in [*prefills, *decodes]:
                await endpoint.goodbye("run over")
            await readers.close()
        return run_wall_s

    async def _build_report(self, run_wall_s: float) -> dict:
        """The run report from the records, every peer's /stats and the ledger's own check; written if asked."""
        # Requests never sent (stopped early) are part of the run too: timed out, not vanished.
        for spec in self.workload[len(self.records):]:
            self.records[spec.request_id] = new_record(self.scenario, spec, spec.arrival_s, timed_out=True)
        if self.scenario.kv_sample == REAL_MODEL_KV:  # decode's real model may still be reading the last hand-offs
            await wait_for_readings(self.stats_from, self.clock)
        peer_stats, missing_stats = await self.collect_stats()
        if self.ledger is not None:
            for stats in peer_stats:
                self.ledger.peer(stats)
            self.ledger.counters(self.registry)
            self.ledger.close()
        result = run_report.build_report(self.scenario, sorted(self.records.values(), key=lambda r: r.request_id),
                                         peer_stats, run_wall_s=run_wall_s, tokens_delivered=self.tokens_delivered,
                                         tokens_overtaking=self.tokens_overtaking,
                                         missing_stats=missing_stats, workload=self.workload,
                                         handoff_splits=self.handoff_splits)
        # The ledger's own verdict on the run (model/judge/ledger_check.py), beside the figures.
        if self.ledger is not None:
            assert self.ledger_path is not None  # the ledger was opened at it
            result["ledger"] = {"path": str(self.ledger_path), **ledger_check(self.ledger_path).summary()}
        self._amend_report(result)
        if self.report_path is not None:
            # No figures here: matplotlib is ~50 MB in a serving process (the whole-run test saw the load
            # generator's RSS grow by that at the end); `kvtransit up` draws them in the harness
            # (harness/up/launcher.py), so a standalone `kvtransit loadgen` report has none.
            run_report.write_report(result, self.report_path, figures=False)
        return result
