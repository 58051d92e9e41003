"""The middlebox's remote-KV path (`--kv-placement remote`, flows/selection/remote_class.py): decode's per-step legs to
the KV pool, over the decode link the hand-offs cross, the page summaries scored by the module on the way.

    decode ──QUERY──▶ middlebox ──SUMMARIES?──▶ kvpool                 (the pool beside us: no link)
    decode ◀─SCORES══ module ◀─── summaries ─── kvpool                 (the summaries cross the decode link)
    decode ──FETCH──▶ middlebox ──FETCH───────▶ kvpool
    decode ◀─PAGES═══ middlebox ◀── pages ───── kvpool                 (the chosen pages cross it too)

The legs are collective frames (wire/group.py: QUERY, SUMMARIES, SCORES, FETCH, PAGES) on their own TCP
connections, payloads as flows/selection/remote_context.py lays them out. Model time runs as in `kvtransit select`
(flows/selection/roles.py): every frame is stamped with when it is due at the far end and decode holds it until
then. The answers' stamps are taken on the hand-off link itself (`LinkStage.stamp`): on our own bucket, between the
hand-offs' slices, when we shape; under tc the bytes queue in tbf behind the hand-offs and the mirror is told. So a
hand-off in flight delays a step's pages and a step's pages delay the next hand-off, on one clock.

The summaries cross the link and are scored by the module at decode's end of it (as the codec's inverse is charged
to the far module, stages/module.py): the SCORES frame carries the scores and, behind them, the summaries that
crossed (decode checks their size), stamped with the module's occupancy when it scores slower than the wire. Quest's
bound needs a max: under `--policy host` the summaries go on to decode unscored.

Decode listens and we dial it (a restarted middlebox dials again); each decode connection has its own connection to
the pool. A pool or decode that goes away ends that pair of connections with the reason logged; decode fails the
step's remote requests with it and we dial again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.flows.selection.metrics import RemoteKvMetrics
from kvtransit.flows.selection.remote_class import occupy_bytes
from kvtransit.flows.selection.remote_context import (
    BF16,
    GROUP,
    IDLE_WAIT_S,
    LegError,
    RemoteShapes,
    array_from,
    pack_ids,
    score,
    unpack_ids,
)
from kvtransit.flows.selection.section import SelectionSection
from kvtransit.runtime.group_link.channel import Channel, PeerGone, PeerSilent
from kvtransit.runtime.group_link.connect import dial
from kvtransit.runtime.tasks import TaskSet
from kvtransit.wire.group import Frame, Kind, abort

log = logging.getLogger(__name__)

LEG_DEADLINE_S = 30.0  # the pool's answer to one leg (a 16 MB context made on first use takes ~0.1 s)
POOL_DIAL_S = 2.0  # a pool that does not answer a dial within this fails the leg (it is beside us: loopback)
REDIAL_S = 0.5  # after a lost decode or pool, dial again this long after (a restart, not model time)


@dataclass
class RemoteKvStats:
    steps: int = 0
    scored_bytes: int = 0  # summaries the module scored, wire bytes at scale
    summary_bytes: int = 0
    page_bytes: int = 0
    failures: dict[str, int] = field(default_factory=dict)

    def to_json(self, model_bytes_per_byte: float) -> dict:
        return {"steps": self.steps, "scored_bytes": self.scored_bytes * model_bytes_per_byte,
                "summary_bytes": self.summary_bytes * model_bytes_per_byte,
                "page_bytes": self.page_bytes * model_bytes_per_byte, "failures": dict(self.failures)}


class RemoteKvRelay:
    """Owned by the middlebox process: one relay per decode's remote-KV port, each with its pool connection."""

    def __init__(self, middlebox: Middlebox, decodes: list[tuple[str, int]], pool: tuple[str, int],
                 metrics: RemoteKvMetrics):
        scenario = middlebox.scenario
        selection = SelectionSection.of(scenario)
        self.middlebox = middlebox
        self.shapes = RemoteShapes.of(scenario)
        self.decodes, self.pool = decodes, pool
        self.metrics = metrics
        self.occupancy = selection.scoring_occupancy(scenario)
        self.in_transit = self.occupancy > 0  # 0: every token, or Quest's bound scored on the host
        self.precision_bits = scenario.precision_bits
        self.model_bytes_per_byte = middlebox.model_bytes_per_byte
        self.stats = RemoteKvStats()
        self._tasks = TaskSet(f"{middlebox.name} remote KV")

    def start(self) -> None:
        for host, port in self.decodes:
            self._tasks.spawn(self._serve_decode(host, port), f"remote KV for decode {host}:{port}")

    async def close(self) -> None:
        await self._tasks.close()

    async def _serve_decode(self, host: str, port: int) -> None:
        clock = self.middlebox.clock
        while True:
            decode = None
            try:
                reader, writer = await dial(host, port, IDLE_WAIT_S, "decode's remote-KV port")
                decode = Channel(reader, writer, clock, rate_Bps=1.0, latency_s=0.0, peer=f"decode {host}:{port}")
                if await self._relay(decode):
                    return  # decode said BYE
            except (PeerGone, LegError) as exc:
                self._failed(f"decode {host}:{port}: {exc}")
                if decode is not None:
                    await decode.send_quietly(abort(GROUP, f"the middlebox: {exc}"))
            finally:
                if decode is not None:
                    await decode.close()
            await asyncio.sleep(REDIAL_S)  # housekeeping: a lost decode is dialled again, no model time

    def _failed(self, reason: str) -> None:
        key = reason[:80]
        self.stats.failures[key] = self.stats.failures.get(key, 0) + 1
        log.warning("remote KV: %s", reason)

    async def _relay(self, decode: Channel) -> bool:
        """Serve decode's legs until it says BYE (True) or goes away (False). A pool that cannot be reached or goes
        away fails the leg: decode is answered an ABORT with the reason (it fails the step's remote requests) and the
        pool is dialled again for the next leg."""
        pool: Channel | None = None
        try:
            while True:
                try:
                    frame = await decode.receive(IDLE_WAIT_S, "decode's next leg")
                except PeerSilent:
                    continue
                except PeerGone:
                    return False
                if frame.kind is Kind.BYE:
                    return True
                if frame.kind is Kind.ABORT:
                    return False
                try:
                    if pool is None:
                        pool = await self._dial_pool()
                    await self._leg(frame, decode, pool)
                except PoolLost as exc:
                    self._failed(str(exc))
                    await decode.send_quietly(abort(GROUP, f"the middlebox: {exc}", step=frame.step))
                    if pool is not None:
                        await pool.close()
                    pool = None
        finally:
            if pool is not None:
                await pool.close()

    async def _dial_pool(self) -> Channel:
        try:
            reader, writer = await dial(*self.pool, POOL_DIAL_S, "the KV pool's remote-KV port")
        except PeerGone as exc:
            raise PoolLost(str(exc)) from None
        return Channel(reader, writer, self.middlebox.clock, rate_Bps=1.0, latency_s=0.0, peer="the KV pool")

    async def _ask_pool(self, pool: Channel, frame: Frame, kind: Kind) -> Frame:
        """Send the pool one request; its answer of `kind` (PoolLost: it went away, or said ABORT)."""
        try:
            await pool.send(frame, shaped=False)
            got = await pool.receive(LEG_DEADLINE_S, f"the pool's {kind.name} of step {frame.step}")
        except PeerGone as exc:
            raise PoolLost(str(exc)) from None
        if got.kind is Kind.ABORT:
            raise PoolLost(f"the KV pool: {got.reason}")
        if (got.kind, got.step) != (kind, frame.step):
            raise LegError(f"the KV pool answered {got.kind.name} of step {got.step}; expected {kind.name} of "
                           f"{frame.step}")
        return got

    async def _leg(self, frame: Frame, decode: Channel, pool: Channel) -> None:
        link = self.middlebox.chain.link
        ids, rest = unpack_ids(frame.payload, frame.kind.name)
        ready_ns = frame.due_ns  # the request reached us (and the pool beside us) then, in model time
        if frame.kind is Kind.QUERY:
            got = await self._ask_pool(pool, Frame(Kind.SUMMARIES, GROUP, frame.step, payload=pack_ids(ids)),
                                       Kind.SUMMARIES)
            _, summaries = unpack_ids(got.payload, "SUMMARIES")
            nbytes = len(summaries)
            self.stats.summary_bytes += nbytes
            self.stats.steps += 1
            if self.in_transit:
                queries = array_from(rest, BF16, self.shapes.query_shape(len(ids)), "QUERY")
                stacked = array_from(summaries, BF16, self.shapes.summary_shape(len(ids)), "SUMMARIES")
                # The module's arithmetic, on a worker thread as the codec's (the loop keeps relaying).
                scores = await asyncio.to_thread(score, self.shapes, queries, stacked, self.precision_bits)
                self.stats.scored_bytes += nbytes
                self.metrics.scored_bytes.inc(nbytes * self.model_bytes_per_byte)
                due = link.stamp(nbytes, ready_ns, occupy_bytes=occupy_bytes(nbytes, self.occupancy))
                answer = Frame(Kind.SCORES, GROUP, frame.step,
                               payload=b"".join((pack_ids(ids), scores.tobytes(), summaries)))
            else:  # Quest's bound: the host (decode) scores
                due = link.stamp(nbytes, ready_ns)
                answer = Frame(Kind.SUMMARIES, GROUP, frame.step, payload=got.payload)
            await decode.send(answer, due_ns=due)
        elif frame.kind is Kind.FETCH:
            got = await self._ask_pool(pool, Frame(Kind.FETCH, GROUP, frame.step, payload=frame.payload), Kind.PAGES)
            nbytes = len(got.payload) - len(pack_ids(ids))
            self.stats.page_bytes += nbytes
            await decode.send(Frame(Kind.PAGES, GROUP, frame.step, payload=got.payload),
                              due_ns=link.stamp(nbytes, ready_ns))
        else:
            raise LegError(f"decode sent {frame.kind.name} at step {frame.step}; expected QUERY or FETCH")


class PoolLost(Exception):
    """The KV pool could not be reached, went away or refused a leg; the message says which."""
