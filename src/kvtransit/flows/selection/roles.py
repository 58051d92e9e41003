"""The three roles of a live selection, each one process (`python -m kvtransit.flows.selection`):

    decode ──QUERY──▶ scorer (the module, at decode's end of the link) ──SUMMARIES?──▶ pool
    decode ◀─SCORES── scorer ◀════ summaries over the link ════════════════════════════ pool
    decode ──FETCH──▶ scorer ──FETCH─────────────────────────────────────────────────▶ pool
    decode ◀─PAGES─── scorer ◀════ the chosen pages' K and V over the link ═════════════ pool

Per decode step (top-k): the query goes to the module, which asks the pool for the pages' summaries; they cross
the link (shaped: latency + bytes / rate, and the module's latency and compute where it scores them,
docs/reference.md §5), the module scores them (kernels/selection.py: group_scores, the MAC of the summed query) and
hands decode one score per page and kv head; decode ranks them (the host's comparisons: rank_pages) and fetches the
chosen pages over the same link; then it holds its step's compute (the model's decode step at the context it attends
to). Quest's min/max bound needs a max, so with `scoring="host"` the summaries go through to decode, which scores them
itself. Without selection (`budget=None`) decode fetches every token, one leg a step.

Model time runs on absolute deadlines as the other live groups' (flows/tp/rank/rank.py): each frame is
stamped with when it is due on the modelled link, counted from when the frame it answers was due (`at_ns`); the
pool and the module pass frames on at once, stamped, and decode holds each until it is due, so the relay's and
the module's host time overlaps the modelled link instead of adding to it (a frame that reaches decode after its
due time is counted late). What is measured is real: each step's time and each fetch's on this host's clock. Every
failure (a peer gone, a deadline, a leg that is not this step's) fails the run with one reason naming the role
and the step, and is passed on (an ABORT), never hung.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtransit.flows.selection.context import PAGE_ID_DTYPE, SCORE_DTYPE, LegError, RemoteContext
from kvtransit.kernels.selection import group_scores, rank_pages
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.group_link.channel import Channel, PeerGone
from kvtransit.wire.group import Frame, Kind, abort

GROUP = 1
ROLE_POOL, ROLE_SCORER, ROLE_DECODE = 0, 1, 2
ROLE_NAMES = {ROLE_POOL: "pool", ROLE_SCORER: "scorer", ROLE_DECODE: "decode"}
SCORING_TRANSIT, SCORING_HOST = "transit", "host"


@dataclass(frozen=True)
class SelectionPlan:
    """What every role of one run agrees on; durations already stretched by the dilation."""

    sample: str
    text: str
    page_size: int
    kind: str  # mean | minmax
    budget: float | None  # fraction of the pages fetched; None: every token (no selection)
    steps: int
    compute_s: float  # decode's step compute, held
    scoring: str = SCORING_TRANSIT  # where the summaries are scored: the module, or the host (Quest's bound)
    precision_bits: int | None = None  # the scores' (the analogue path's)
    sink_pages: int = 0
    wire_dtype: str = "float16"
    module_occupancy: float = 0.0  # summaries scored in transit: link bytes per byte when transit-bound (0: none)
    module_latency_s: float = 0.0
    deadline_s: float = 10.0

    @property
    def selects(self) -> bool:
        return self.budget is not None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class SelectionFailed(Exception):
    """The run failed; the message is the one reason every role reports."""


async def _receive(channel: Channel, plan: SelectionPlan, me: str, kind: Kind, step: int, what: str) -> Frame:
    frame = await channel.receive_or_fail(plan.deadline_s, f"{what} of step {step}", SelectionFailed, me)
    if (frame.kind, frame.group, frame.step) != (kind, GROUP, step):
        raise SelectionFailed(f"{me}: at step {step} expected {kind.name}, got {frame.kind.name} of step {frame.step}")
    return frame


# --- the pool -----------------------------------------------------------------------------------------------

@dataclass
class PoolResult:
    ok: bool = True
    reason: str = ""
    summary_bytes: int = 0
    page_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def serve_pool(plan: SelectionPlan, ctx: RemoteContext, scorer: Channel) -> PoolResult:
    """Answer the module's requests until it says BYE: summaries (over the module: its terms), pages."""
    result = PoolResult()
    try:
        while True:
            try:
                frame = await scorer.receive(plan.deadline_s * (plan.steps + 2), "the module's next request")
            except PeerGone as exc:
                raise SelectionFailed(f"the pool found: {exc}") from None
            if frame.kind is Kind.BYE:
                return result
            if frame.kind is Kind.ABORT:
                raise SelectionFailed(frame.reason)
            try:
                if frame.kind is Kind.SUMMARIES:
                    payload = ctx.summary_bytes(frame.step, plan.kind)
                    occupy = (math.ceil(len(payload) * plan.module_occupancy)
                              if plan.scoring == SCORING_TRANSIT and plan.module_occupancy > 1 else None)
                    await scorer.send(Frame(Kind.SUMMARIES, GROUP, frame.step, rank=ROLE_POOL, payload=payload),
                                      at_ns=frame.due_ns, occupy_bytes=occupy,
                                      added_latency_s=plan.module_latency_s if plan.scoring == SCORING_TRANSIT else 0)
                    result.summary_bytes += len(payload)
                elif frame.kind is Kind.FETCH:
                    data = ctx.pages_payload(frame.step, ctx.ids_from(bytes(frame.payload), frame.step)).tobytes()
                    await scorer.send(Frame(Kind.PAGES, GROUP, frame.step, rank=ROLE_POOL, payload=data),
                                      at_ns=frame.due_ns)
                    result.page_bytes += len(data)
                else:
                    raise SelectionFailed(f"the pool: unexpected {frame.kind.name} at step {frame.step}")
            except LegError as exc:
                raise SelectionFailed(f"the pool: {exc}") from None
    except SelectionFailed as exc:
        result.ok, result.reason = False, str(exc)
        await scorer.send_quietly(abort(GROUP, result.reason, rank=ROLE_POOL))
        return result


# --- the module (scorer) --------------------------------------------------------------------------------------

@dataclass
class ScorerResult:
    ok: bool = True
    reason: str = ""
    scored_bytes: int = 0  # summaries the module scored (its input)
    scores: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def serve_scorer(plan: SelectionPlan, ctx: RemoteContext, decode: Channel, pool: Channel) -> ScorerResult:
    """Relay decode's legs to the pool and back, scoring the summaries on the way when in transit."""
    result, me = ScorerResult(), "the module"
    step = 0
    try:
        while True:
            try:
                frame = await decode.receive(plan.deadline_s * (plan.steps + 2), "decode's next leg")
            except PeerGone as exc:
                raise SelectionFailed(f"{me} found: {exc}") from None
            step = frame.step
            if frame.kind is Kind.BYE:
                await pool.send_quietly(Frame(Kind.BYE, GROUP, step, rank=ROLE_SCORER))
                return result
            if frame.kind is Kind.ABORT:
                raise SelectionFailed(frame.reason)
            # Nothing is held here: every frame is stamped with when it is due in model time, and only decode
            # holds (what the module does on the way, the host does while the modelled link still runs).
            if frame.kind is Kind.QUERY:
                query = ctx.query_from(bytes(frame.payload), step)
                await pool.send(Frame(Kind.SUMMARIES, GROUP, step, rank=ROLE_SCORER), at_ns=frame.due_ns)
                got = await _receive(pool, plan, me, Kind.SUMMARIES, step, "the pool's summaries")
                if plan.scoring == SCORING_TRANSIT:
                    scores = group_scores(query, ctx.summaries_from(bytes(got.payload), step, plan.kind),
                                          plan.precision_bits).astype(SCORE_DTYPE)
                    result.scored_bytes += len(got.payload)
                    result.scores += scores.size
                    answer = Frame(Kind.SCORES, GROUP, step, rank=ROLE_SCORER, payload=scores.tobytes())
                else:  # Quest's bound: the host scores
                    answer = Frame(Kind.SUMMARIES, GROUP, step, rank=ROLE_SCORER, payload=got.payload)
                await decode.send(answer, at_ns=got.due_ns)
            elif frame.kind is Kind.FETCH:
                await pool.send(Frame(Kind.FETCH, GROUP, step, rank=ROLE_SCORER, payload=frame.payload),
                                at_ns=frame.due_ns)
                got = await _receive(pool, plan, me, Kind.PAGES, step, "the pool's pages")
                await decode.send(Frame(Kind.PAGES, GROUP, step, rank=ROLE_SCORER, payload=got.payload),
                                  at_ns=got.due_ns)
            else:
                raise SelectionFailed(f"{me}: unexpected {frame.kind.name} from decode at step {step}")
    except (SelectionFailed, LegError) as exc:
        result.ok, result.reason = False, str(exc)
        for channel in (decode, pool):
            await channel.send_quietly(abort(GROUP, result.reason, step=step, rank=ROLE_SCORER))
        return result


# --- decode ----------------------------------------------------------------------------------------------

@dataclass
class DecodeResult:
    ok: bool = True
    reason: str = ""
    step_s: list[float] = field(default_factory=list)
    fetch_s: list[float] = field(default_factory=list)  # step start (due) to the pages held
    summary_bytes: list[int] = field(default_factory=list)  # a step's summaries off the link (0: no selection)
    page_bytes: list[int] = field(default_factory=list)  # a step's pages (K and V) off the link
    chosen_pages: list[float] = field(default_factory=list)  # a step's mean per layer and kv head
    late_s: float = 0.0
    accuracy: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        steady = slice(1, None) if len(self.step_s) > 1 else slice(None)  # step 0 warms up
        def median(xs: list[float]) -> float:
            return statistics.median(xs[steady]) if xs[steady] else math.nan
        return {"ok": self.ok, "reason": self.reason, "step_s": self.step_s, "fetch_s": self.fetch_s,
                "step_median_s": median(self.step_s), "fetch_median_s": median(self.fetch_s),
                "summary_bytes": self.summary_bytes, "page_bytes": self.page_bytes,
                "chosen_pages": self.chosen_pages, "late_s": self.late_s,
                "accuracy": self.accuracy}


class _Judge:
    """What arrived, judged after the timed steps against exact attention over the whole context (the sample's
    own K and V): the attention-mass recall of the chosen pages and the attention-output error, as
    kernels/selection.py: evaluate_selection defines them."""

    def __init__(self, ctx: RemoteContext):
        self.ctx = ctx
        self.recall_sum = self.count = 0.0
        self.num = self.den = 0.0

    def add(self, step: int, query: np.ndarray, kv: np.ndarray, ids: np.ndarray | None) -> None:
        ctx = self.ctx
        end = ctx.position(step) + 1
        paged = ctx.pages(step) * ctx.page_size
        group = query.shape[1] // ctx.kv_heads
        d = ctx.head_dim
        for layer in range(ctx.layers):
            q = query[layer].astype(np.float64)
            k_all = np.repeat(ctx.sample.k[layer, :, :end].astype(np.float64), group, axis=0)
            v_all = np.repeat(ctx.sample.v[layer, :, :end].astype(np.float64), group, axis=0)
            w = _softmax(np.einsum("hd,htd->ht", q, k_all) / math.sqrt(d))
            exact = np.einsum("ht,htd->hd", w, v_all)
            k_got = np.repeat(kv[layer, 0].astype(np.float64), group, axis=0)
            v_got = np.repeat(kv[layer, 1].astype(np.float64), group, axis=0)
            got = np.einsum("ht,htd->hd", _softmax(np.einsum("hd,htd->ht", q, k_got) / math.sqrt(d)), v_got)
            self.num += float(np.sum((got - exact) ** 2))
            self.den += float(np.sum(exact ** 2))
            if ids is None or not paged:
                self.recall_sum += q.shape[0]
            else:
                mask = np.zeros((ctx.kv_heads, paged), bool)
                for head in range(ctx.kv_heads):
                    for page in ids[layer, head]:
                        mask[head, page * ctx.page_size:(page + 1) * ctx.page_size] = True
                keep = np.repeat(mask, group, axis=0)
                mass = w[:, :paged].sum(axis=-1)
                self.recall_sum += float(np.sum(np.where(mass > 0, (w[:, :paged] * keep).sum(axis=-1) /
                                                         np.where(mass > 0, mass, 1), 1.0)))
            self.count += q.shape[0]

    def result(self) -> dict[str, Any]:
        return {"recall": self.recall_sum / self.count if self.count else math.nan,
                "output_error": math.sqrt(self.num / self.den) if self.den else 0.0}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


async def run_decode(plan: SelectionPlan, ctx: RemoteContext, clock: Clock, scorer: Channel,
                     start_ns: int) -> DecodeResult:
    """The decode steps: (query → scores → rank →) fetch, then the step's compute, on absolute deadlines."""
    result, me = DecodeResult(), "decode"
    arrived: list[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]] = []
    await clock.sleep_until(start_ns)
    t = start_ns
    step = 0
    try:
        for step in range(plan.steps):
            query = ctx.query(step)
            ids: np.ndarray | None = None
            summaries = 0
            at = t
            if plan.selects:
                assert plan.budget is not None
                await scorer.send(Frame(Kind.QUERY, GROUP, step, rank=ROLE_DECODE,
                                        payload=ctx.query_bytes(step)), at_ns=at)
                kind = Kind.SCORES if plan.scoring == SCORING_TRANSIT else Kind.SUMMARIES
                got = await _receive(scorer, plan, me, kind, step, "the page scores")
                await scorer.hold_until_due(got)
                if kind is Kind.SCORES:
                    scores = ctx.scores_from(bytes(got.payload), step).astype(np.float64)
                    summaries = ctx.summary_size(step, plan.kind)  # what crossed the link into the module
                else:
                    scores = group_scores(query, ctx.summaries_from(bytes(got.payload), step, plan.kind),
                                          plan.precision_bits)
                    summaries = len(got.payload)
                ids = rank_pages(scores, plan.budget, plan.sink_pages).astype(PAGE_ID_DTYPE)
                at = got.due_ns
            await scorer.send(Frame(Kind.FETCH, GROUP, step, rank=ROLE_DECODE,
                                    payload=b"" if ids is None else ids.tobytes()), at_ns=at)
            got = await _receive(scorer, plan, me, Kind.PAGES, step, "the pages")
            kv = ctx.pages_from(bytes(got.payload), step, None if ids is None else ids.shape[-1])
            await scorer.hold_until_due(got)
            result.fetch_s.append((clock.now_ns() - t) / 1e9)
            result.summary_bytes.append(summaries)
            result.page_bytes.append(len(got.payload))
            result.chosen_pages.append(float(ctx.pages(step) if ids is None else ids.shape[-1]))
            arrived.append((step, query, kv, ids))
            step_due_ns, t = t, got.due_ns + round(plan.compute_s * 1e9)
            await clock.sleep_until(t)
            # From when the step was due to start (model time is this host's clock), as its fetch is: a late wake-up
            # at the step's start is not taken off it, a late end counts in full. Measured from the wake-up instead,
            # a VM slow to wake made steps read 17-35 % shorter than the model.
            result.step_s.append((clock.now_ns() - step_due_ns) / 1e9)
    except (SelectionFailed, LegError) as exc:
        result.ok, result.reason = False, str(exc)
        await scorer.send_quietly(abort(GROUP, result.reason, step=step, rank=ROLE_DECODE))
        return result
    result.late_s = scorer.late_ns / 1e9
    await scorer.send_quietly(Frame(Kind.BYE, GROUP, step, rank=ROLE_DECODE))
    judge = _Judge(ctx)
    for step, query, kv, ids in arrived:
        judge.add(step, query, kv, ids)
    result.accuracy = judge.result()
    return result
