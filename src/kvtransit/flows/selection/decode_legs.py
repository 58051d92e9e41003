"""Decode's remote-KV legs (`--kv-placement remote`, flows/selection/remote_class.py): before a step's compute, the
remote contexts of its long-context requests are fetched through the middlebox over the decode link.

    top-k: QUERY → (the module scores the pages' summaries that crossed the link) → SCORES → rank → FETCH → PAGES
    all:   FETCH → PAGES (every token)

The middlebox dials our remote-KV port (on `--listen`'s host, any free port, in the readiness line; the newest
connection is the one used, so a restarted middlebox takes over). Frames are stamped with when they are due here
(the middlebox stamps the answers on the link it shares with the hand-offs; we stamp our requests with the link's
latency) and held until then, so the legs end when the modelled link says, later when the link was busy or the
host slow: that is what is measured (`legs_s`, from the step's start to the pages held) beside the model at the
bytes that moved (flows/selection/remote_class.py: legs_model_s, an idle link). The step's compute is held after the
legs, on the same absolute deadlines as every step.

A leg that fails (no middlebox within the deadline, a peer gone, an ABORT, bytes that are not this step's) raises
`RemoteKvFailed` with the reason; decode fails the step's remote requests with it and goes on with the rest.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtransit.flows.selection.metrics import RemoteKvMetrics
from kvtransit.flows.selection.remote_class import SELECT_TOP_K, legs_model_s
from kvtransit.flows.selection.remote_context import (
    BF16,
    GROUP,
    SCORE_DTYPE,
    LegError,
    RemoteShapes,
    array_from,
    choose,
    pack_ids,
    score,
    step_queries,
    unpack_ids,
)
from kvtransit.flows.selection.section import SelectionSection
from kvtransit.model.judge.slo import percentile
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.channel import Channel, PeerGone
from kvtransit.wire.group import Frame, Kind

# How long a step waits for the middlebox's connection, or for an answer, before failing its remote requests: a
# failure deadline, not model time (a 16 MB context is made on first use in ~0.1 s; a run's whole hold is far less).
LEG_DEADLINE_S = 30.0
CONNECT_WAIT_S = 10.0  # for the middlebox's connection (a restarted middlebox dials again within a second or two)
# Recent steps' legs kept to tell which hand-offs met them on the link (a hand-off lasts at most a few steps).
RECENT_LEGS = 64
MAX_LISTED_HANDOFFS = 100_000  # /stats lists the request ids of hand-offs that shared the link (bounded)

HandoffsOnLink = Callable[[int, int], bool]
"""Whether any hand-off was on the link between two monotonic ns (decode's own record of its arrivals)."""
OnLinkBytes = Callable[[int], None]
"""The link meter's: an answer's bytes arrived over the link now (they share a hand-off's time when one is on it)."""


class RemoteKvFailed(Exception):
    """A step's remote legs failed; the message is the reason its remote requests end with."""


@dataclass
class RemoteKvRecord:
    """What the legs did, model units (bytes × 1/scale, seconds ÷ dilation)."""

    steps: int = 0
    requests: int = 0  # remote request-steps (a step with n remote requests counts n)
    summary_bytes: float = 0.0
    page_bytes: float = 0.0
    chosen_pages: int = 0  # pages fetched per layer and kv head, summed over request-steps
    legs_s: list[float] = field(default_factory=list)  # measured, a step
    model_s: list[float] = field(default_factory=list)  # the model at the bytes moved, an idle link
    shared: list[bool] = field(default_factory=list)  # a hand-off was on the link during the step's legs
    late_s: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)
    shared_handoffs: set[int] = field(default_factory=set)  # hand-offs that met remote legs on the link

    def to_json(self) -> dict:
        # Judged on the steps whose legs had the link to themselves: a hand-off on it makes them longer, as it should.
        ratios = [m / d for m, d, shared in zip(self.legs_s, self.model_s, self.shared, strict=True)
                  if d > 0 and not shared]
        return {"steps": self.steps, "idle_link_steps": len(ratios), "request_steps": self.requests,
                "summary_bytes": self.summary_bytes,
                "page_bytes": self.page_bytes, "legs_seconds": sum(self.legs_s), "model_seconds": sum(self.model_s),
                "legs_median_s": statistics.median(self.legs_s) if self.legs_s else None,
                "model_median_s": statistics.median(self.model_s) if self.model_s else None,
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_p99": percentile(ratios, 99) if ratios else None,  # the report's own (model/judge/slo.py)
                "chosen_pages_mean": self.chosen_pages / self.requests if self.requests else None,
                "late_s": self.late_s, "failures": dict(self.failures),
                "shared_handoffs": sorted(self.shared_handoffs)[:MAX_LISTED_HANDOFFS]}


class RemoteKvLegs:
    def __init__(self, scenario: Scenario, clock: Clock, metrics: RemoteKvMetrics, handoffs_on_link: HandoffsOnLink,
                 on_link_bytes: OnLinkBytes):
        selection_section = SelectionSection.of(scenario)
        selection = selection_section
        self.scenario = scenario
        self.clock = clock
        self.metrics = metrics
        self.shapes = RemoteShapes.of(scenario)
        self.selects = selection.select_mode == SELECT_TOP_K
        # Quest's bound under --policy host: the module does not score, decode does.
        self.host_scores = self.selects and selection.scoring_occupancy(scenario) == 0
        link = scenario.scaled_link
        self._latency_ns = round(link.latency_s * 1e9)
        self.model_bytes_per_byte = 1.0 / scenario.effective_scale
        self.record = RemoteKvRecord()
        self.handoffs_on_link = handoffs_on_link
        self.on_link_bytes = on_link_bytes
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_LEGS)  # (start, end) ns of recent steps' legs
        self._open_since_ns: int | None = None  # the legs in progress
        self._channel: Channel | None = None
        self._connected = asyncio.Event()
        self._server: asyncio.Server | None = None

    # -- the middlebox's connection -------------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._accept, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        old, self._channel = self._channel, Channel(reader, writer, self.clock, rate_Bps=1.0, latency_s=0.0,
                                                    peer="the middlebox's remote-KV relay")
        self._connected.set()
        if old is not None:
            await old.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.send_quietly(Frame(Kind.BYE, GROUP))
            await self._channel.close()
        if self._server is not None:
            self._server.close()

    async def _link(self) -> Channel:
        if self._channel is None:
            try:
                async with asyncio.timeout(CONNECT_WAIT_S):
                    await self._connected.wait()
            except TimeoutError:
                raise PeerGone(f"no middlebox connected within {CONNECT_WAIT_S:g} s") from None
        assert self._channel is not None
        return self._channel

    # -- one step's legs --------------------------------------------------------------------------------------

    async def fetch(self, step: int, ids: list[int], start_ns: int) -> int:
        """The legs of step `step` for remote requests `ids`, from `start_ns` (the step's due start); returns, once the
        pages are held, when they were: their due time, or their arrival when they came later (the compute is held
        from there; a wake-up's own lateness is not carried on)."""
        self._open_since_ns = start_ns
        try:
            end_ns = await self._fetch(step, ids, start_ns)
            self._recent.append((start_ns, end_ns))
            return end_ns
        except (PeerGone, LegError) as exc:
            channel, self._channel = self._channel, None
            self._connected.clear()
            if channel is not None:
                await channel.close()
            reason = f"remote KV: {exc}"
            self.record.failures[reason[:80]] = self.record.failures.get(reason[:80], 0) + 1
            raise RemoteKvFailed(reason) from None
        finally:
            self._open_since_ns = None

    def met_handoff(self, request_id: int, start_ns: int, end_ns: int) -> None:
        """A hand-off was on the link from `start_ns` to `end_ns`: if remote legs were too, it did not have the link
        to itself (the report's hand-off check leaves it out)."""
        open_since = self._open_since_ns
        if (open_since is not None and open_since < end_ns) or any(
                s < end_ns and start_ns < e for s, e in self._recent):
            self.record.shared_handoffs.add(request_id)

    async def _fetch(self, step: int, ids: list[int], start_ns: int) -> int:
        channel = await self._link()
        s, n = self.shapes, len(ids)
        at_ns, summary_bytes, page_ids = start_ns, 0, b""
        late_before = channel.late_ns
        if self.selects:
            queries = step_queries(s, self.scenario.seed, ids, step)
            await channel.send(Frame(Kind.QUERY, GROUP, step, payload=pack_ids(ids) + queries.tobytes()),
                               due_ns=at_ns + self._latency_ns)
            got = await self._answer(channel, Kind.SUMMARIES if self.host_scores else Kind.SCORES, step, ids)
            self.on_link_bytes(s.nbytes(s.summary_shape(n)))
            await channel.hold_until_due(got)
            _, rest = unpack_ids(got.payload, got.kind.name)
            summaries_size = s.nbytes(s.summary_shape(n))
            if self.host_scores:
                scores = score(s, queries, array_from(rest, BF16, s.summary_shape(n), "SUMMARIES"),
                               self.scenario.precision_bits)
            else:
                score_size = s.nbytes(s.score_shape(n), SCORE_DTYPE)
                if len(rest) != score_size + summaries_size:
                    raise LegError(f"SCORES at step {step}: {len(rest)} B, expected {score_size} B of scores and "
                                   f"{summaries_size} B of the summaries that crossed")
                scores = array_from(rest, SCORE_DTYPE, s.score_shape(n), "SCORES")
            summary_bytes = summaries_size
            chosen = choose(s, scores)
            page_ids, at_ns = chosen.tobytes(), got.due_ns
        await channel.send(Frame(Kind.FETCH, GROUP, step, payload=pack_ids(ids) + page_ids),
                           due_ns=at_ns + self._latency_ns)
        got = await self._answer(channel, Kind.PAGES, step, ids)
        arrived_ns = self.clock.now_ns()
        self.on_link_bytes(len(got.payload))
        _, rest = unpack_ids(got.payload, "PAGES")
        expected = s.nbytes(s.pages_shape(n, self.selects))
        if len(rest) != expected:
            raise LegError(f"PAGES at step {step}: {len(rest)} B, expected {expected} B for {n} contexts")
        await channel.hold_until_due(got)
        self._count(n, summary_bytes, expected, start_ns, channel.late_ns - late_before,
                    shared=self.handoffs_on_link(start_ns, got.due_ns))
        return max(got.due_ns, arrived_ns)

    async def _answer(self, channel: Channel, kind: Kind, step: int, ids: list[int]) -> Frame:
        got = await channel.receive(LEG_DEADLINE_S, f"{kind.name} of step {step}")
        if got.kind is Kind.ABORT:
            raise PeerGone(got.reason)
        if (got.kind, got.step) != (kind, step) or unpack_ids(got.payload, kind.name)[0] != ids:
            raise LegError(f"expected {kind.name} of step {step} for requests {ids[:4]}..., got {got.kind.name} of "
                           f"step {got.step}")
        return got

    def _count(self, n: int, summary_bytes: int, page_bytes: int, start_ns: int, late_ns: int, *,
               shared: bool) -> None:
        scenario, r = self.scenario, self.record
        selection = SelectionSection.of(scenario)
        model_summary, model_pages = summary_bytes * self.model_bytes_per_byte, page_bytes * self.model_bytes_per_byte
        measured_s = scenario.model_s((self.clock.now_ns() - start_ns) / 1e9)
        model_s = legs_model_s(scenario.link_spec, model_summary, model_pages,
                               module_latency_s=scenario.module.added_latency_s,
                               occupancy=selection.scoring_occupancy(scenario))
        r.steps += 1
        r.requests += n
        r.summary_bytes += model_summary
        r.page_bytes += model_pages
        r.chosen_pages += n * (self.shapes.chosen if self.selects else self.shapes.pages)
        r.legs_s.append(measured_s)
        r.model_s.append(model_s)
        r.shared.append(shared)
        r.late_s += late_ns / 1e9
        m = self.metrics
        m.steps.inc()
        m.bytes.labels(phase="summaries").inc(model_summary)
        m.bytes.labels(phase="pages").inc(model_pages)
        m.legs_seconds.labels(source="measured").inc(measured_s)
        m.legs_seconds.labels(source="model").inc(model_s)

    def attended_tokens(self, n: int) -> int:
        """Remote tokens the step's attention reads for `n` remote requests."""
        return n * self.shapes.page_tokens(self.selects)
