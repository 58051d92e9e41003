"""The remote contexts of `kvtransit up --kv-placement remote` and the bytes of each leg (numpy; no I/O).

A long-context request (flows/selection/remote_class.py: in_remote_class) attends to `remote_context` tokens of KV held
by the pool. Its content is synthetic KV at the run's scale (kernels/synthetic_kv.py, the generator the hand-off uses,
on its own seed so a context is not the request's own prompt KV): [layers, 2, kv_heads, tokens, head_dim] BF16. Its
templates are 4,096 tokens long, so a 32k context repeats them: the page scores (and the pages chosen) are real
arithmetic on real bytes, but what they choose says nothing about selection quality; that is measured on real KV by
`kvtransit select` and `kvtransit accuracy --select` (docs/results/selection.md).

The legs of one decode step carry every remote request of its batch, in the order of `ids` (each leg's header says
them, so a leg that answers other requests is caught):

- QUERY   decode → module: ids, then the step's queries [n, layers, q_heads, D] BF16;
- SUMMARIES module → pool: ids; pool → module: the pages' summaries [n, vectors, layers, kv_heads, pages, D] BF16
  (vectors 1: the mean key, 2: Quest's min and max);
- SCORES  module → decode: ids, float32 scores [n, layers, kv_heads, pages], then the summaries that crossed the
  link to the module (decode checks their size and drops them); with the host scoring (Quest's bound,
  `--policy host`) the module passes SUMMARIES on instead and decode scores them;
- FETCH   decode → module → pool: ids, then int32 page ids [n, layers, kv_heads, k] (none: every token);
- PAGES   pool → module → decode: ids, then the chosen pages' K and V and the tail [n, layers, 2, kv_heads, t, D].
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from ml_dtypes import bfloat16

from kvtransit.flows.selection.remote_class import SELECT_TOP_K
from kvtransit.flows.selection.section import SelectionSection
from kvtransit.kernels.selection import PageSummaries, group_scores, page_summaries, rank_pages
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.scenario import Scenario

# The legs' group id on the wire (wire/group.py frames; `kvtransit select`'s harness is 1).
GROUP = 2
# Between steps decode may say nothing for a long time (an idle run): a connection is kept through silence; only an
# answer owed has a deadline.
IDLE_WAIT_S = 3600.0
BF16 = np.dtype(bfloat16)  # the KV's dtype on the wire (docs/reference.md §1)
SCORE_DTYPE = np.dtype(np.float32)
PAGE_ID_DTYPE = np.dtype(np.int32)
ID_DTYPE = np.dtype(np.int64)
# A remote context's seed is the run's, offset so it is not the same bank as the hand-offs' KV.
CONTEXT_SEED_SALT = 0x52454D4F  # "REMO"
# What the pool keeps made (LRU), bytes at scale: 2 GiB of this 24 GiB host; at least MIN_CACHED contexts.
CONTEXT_CACHE_BYTES = 2 << 30
MIN_CACHED = 16
# The long contexts are in the pool before their requests come (a document cached earlier): the pool makes the next
# AHEAD remote requests' contexts in the background (making a 32k one takes ~0.1 s, which a step's legs must not
# wait for). Request ids are the workload's order (model/serving/workload.py), so "next" is known.
AHEAD = 8


class LegError(ValueError):
    """A leg's bytes are not what this step expects; the message says which leg and what was wrong."""


def pack_ids(ids: list[int]) -> bytes:
    return np.asarray([len(ids), *ids], dtype=ID_DTYPE).tobytes()


def unpack_ids(data: bytes | bytearray | memoryview, leg: str) -> tuple[list[int], memoryview]:
    """The request ids a leg names, and the rest of its payload."""
    view = memoryview(data)
    if len(view) < ID_DTYPE.itemsize:
        raise LegError(f"{leg}: {len(view)} B, too short for its request count")
    n = int(np.frombuffer(view[:ID_DTYPE.itemsize], ID_DTYPE)[0])
    end = (1 + n) * ID_DTYPE.itemsize
    if n < 1 or len(view) < end:
        raise LegError(f"{leg}: names {n} requests in {len(view)} B")
    return [int(i) for i in np.frombuffer(view[ID_DTYPE.itemsize:end], ID_DTYPE)], view[end:]


@dataclass(frozen=True)
class RemoteShapes:
    """What both ends agree on from the scenario alone: the context's layout at scale and its pages."""

    layers: int
    kv_heads: int
    q_heads: int
    head_dim: int
    tokens: int
    page_size: int
    kind: str
    budget: float | None  # None: every token

    @classmethod
    def of(cls, scenario: Scenario) -> RemoteShapes:
        selection_section = SelectionSection.of(scenario)
        selection = selection_section
        layout, model = scenario.kv_layout, scenario.model_spec
        step = selection.selection_step(scenario)
        return cls(layers=layout.layers, kv_heads=layout.kv_heads,
                   q_heads=layout.kv_heads * (model.n_heads // model.kv_heads), head_dim=layout.head_dim,
                   tokens=selection.remote_context, page_size=selection.page_size, kind=selection.select_summary,
                   budget=step.budget if selection.select_mode == SELECT_TOP_K else None)

    @property
    def pages(self) -> int:
        return self.tokens // self.page_size

    @property
    def tail(self) -> int:
        return self.tokens - self.pages * self.page_size

    @property
    def vectors(self) -> int:
        return 1 if self.kind == "mean" else 2

    @property
    def chosen(self) -> int:
        """Pages each layer and kv head fetches (rank_pages' k)."""
        if self.budget is None:
            return self.pages
        return max(1, int(np.ceil(self.budget * self.pages - 1e-9)))

    def summary_shape(self, n: int) -> tuple[int, ...]:
        return (n, self.vectors, self.layers, self.kv_heads, self.pages, self.head_dim)

    def score_shape(self, n: int) -> tuple[int, ...]:
        return (n, self.layers, self.kv_heads, self.pages)

    def query_shape(self, n: int) -> tuple[int, ...]:
        return (n, self.layers, self.q_heads, self.head_dim)

    def page_tokens(self, selected: bool) -> int:
        return self.chosen * self.page_size + self.tail if selected else self.tokens

    def pages_shape(self, n: int, selected: bool) -> tuple[int, ...]:
        return (n, self.layers, 2, self.kv_heads, self.page_tokens(selected), self.head_dim)

    def nbytes(self, shape: tuple[int, ...], dtype: np.dtype = BF16) -> int:
        return int(np.prod(shape)) * dtype.itemsize


def array_from(data: bytes | bytearray | memoryview, dtype: np.dtype, shape: tuple[int, ...], leg: str) -> np.ndarray:
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) < expected:
        raise LegError(f"{leg}: {len(data)} B, expected {expected} B for {shape} {dtype}")
    return np.frombuffer(data, dtype, count=int(np.prod(shape))).reshape(shape)


class RemoteContexts:
    """The pool's side: each remote request's context, its summaries and the pages a FETCH asks for."""

    def __init__(self, scenario: Scenario):
        self.shapes = shapes = RemoteShapes.of(scenario)
        self.kv = SyntheticKv(shapes.layers, shapes.kv_heads, shapes.head_dim, scenario.seed ^ CONTEXT_SEED_SALT,
                              sample_path=scenario.kv_sample_path)
        selection = SelectionSection.of(scenario)
        self._is_remote = lambda request_id: selection.is_remote_request(scenario, request_id)
        context_bytes = shapes.layers * 2 * shapes.kv_heads * shapes.tokens * shapes.head_dim * BF16.itemsize
        self.capacity = max(MIN_CACHED, CONTEXT_CACHE_BYTES // context_bytes)
        self._made: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()  # the cache is shared by the legs' worker threads and the making ahead
        self.made_on_demand = 0  # contexts a leg had to wait for (not made ahead)

    def make_ahead(self, after_id: int, count: int = AHEAD) -> None:
        """Make the contexts of the next `count` remote requests after `after_id` (blocking: run it on a thread)."""
        rid, made = after_id, 0
        while made < count:
            rid += 1
            if self._is_remote(rid):
                self._context(rid, ahead=True)
                made += 1

    def _context(self, request_id: int, ahead: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(KV [layers, 2, kv_heads, tokens, D] BF16, summaries [vectors, layers, kv_heads, pages, D] BF16)."""
        with self._lock:
            if request_id in self._made:
                self._made.move_to_end(request_id)
                return self._made[request_id]
        if not ahead:
            self.made_on_demand += 1
        s = self.shapes
        kv = np.stack([self.kv.layer(request_id, layer, s.tokens) for layer in range(s.layers)])
        paged = kv[:, 0, :, :s.pages * s.page_size, :]
        summary = page_summaries(paged, s.page_size, s.kind)
        parts = [summary.mean] if s.kind == "mean" else [summary.low, summary.high]
        summaries = np.stack([p for p in parts if p is not None]).astype(bfloat16)
        with self._lock:
            self._made[request_id] = (kv, summaries)
            while len(self._made) > self.capacity:
                self._made.popitem(last=False)
        return kv, summaries

    def summaries(self, ids: list[int]) -> bytes:
        return b"".join(self._context(rid)[1].tobytes() for rid in ids)

    def pages(self, ids: list[int], page_ids: np.ndarray | None) -> bytes:
        """The chosen pages' K and V then the tail, request by request; every token when `page_ids` is None."""
        s = self.shapes
        if page_ids is None:
            return b"".join(self._context(rid)[0].tobytes() for rid in ids)
        # Whole pages are gathered as rows (a page is page_size × D contiguous values of one layer, K or V, and kv
        # head), by two index arrays on a view of 16-bit words: 12-18x faster than take_along_axis on the 5-d
        # bfloat16 array at 8k tokens (1.5 -> 0.09 ms a step at 1/256, benchmarks/remote_legs_host.py), which
        # matters because the leg's host time counts against its modelled link time.
        groups, paged_tokens, k = s.layers * 2 * s.kv_heads, s.pages * s.page_size, s.chosen
        group_rows = np.arange(groups)[:, None]
        out = np.empty(s.pages_shape(len(ids), True), np.uint16)
        for i, rid in enumerate(ids):
            chosen = page_ids[i]
            if chosen.min() < 0 or chosen.max() >= s.pages:
                raise LegError(f"FETCH for request {rid}: page ids {chosen.min()}..{chosen.max()} outside its "
                               f"{s.pages} pages")
            kv = self._context(rid)[0].view(np.uint16)
            pages = kv.reshape(groups, -1)[:, :paged_tokens * s.head_dim].reshape(groups, s.pages, -1)  # a view
            per_group = np.broadcast_to(chosen[:, None], (s.layers, 2, s.kv_heads, k)).reshape(groups, k)
            out[i, ..., :k * s.page_size, :] = pages[group_rows, per_group].reshape(
                s.layers, 2, s.kv_heads, k * s.page_size, s.head_dim)
            out[i, ..., k * s.page_size:, :] = kv[..., paged_tokens:, :]
        return out.tobytes()

    def page_ids_from(self, rest: memoryview, n: int) -> np.ndarray | None:
        if not len(rest):
            return None
        s = self.shapes
        return array_from(rest, PAGE_ID_DTYPE, (n, s.layers, s.kv_heads, s.chosen), "FETCH")


def step_queries(shapes: RemoteShapes, seed: int, ids: list[int], step: int) -> np.ndarray:
    """The step's queries [n, layers, q_heads, D] BF16, deterministic per (seed, request, step): what decode's
    attention would score the pages with."""
    out = np.empty(shapes.query_shape(len(ids)), dtype=bfloat16)
    for i, rid in enumerate(ids):
        rng = np.random.default_rng([CONTEXT_SEED_SALT, seed & 0xFFFFFFFF, rid & 0xFFFFFFFF, step & 0xFFFFFFFF])
        out[i] = rng.standard_normal(shapes.query_shape(1)[1:], dtype=np.float32).astype(bfloat16)
    return out


def score(shapes: RemoteShapes, queries: np.ndarray, summaries: np.ndarray, precision_bits: int | None) -> np.ndarray:
    """The module's kernel (the host's, for Quest's bound): scores [n, layers, kv_heads, pages] float32."""
    q = queries.astype(np.float64)
    s = summaries.astype(np.float64)
    if shapes.kind == "mean":
        pages = PageSummaries("mean", shapes.page_size, mean=s[:, 0])
    else:
        pages = PageSummaries("minmax", shapes.page_size, low=s[:, 0], high=s[:, 1])
    return group_scores(q, pages, precision_bits).astype(SCORE_DTYPE)


def choose(shapes: RemoteShapes, scores: np.ndarray) -> np.ndarray:
    """The host's ranking: page ids [n, layers, kv_heads, k] int32."""
    assert shapes.budget is not None
    return rank_pages(scores.astype(np.float64), shapes.budget).astype(PAGE_ID_DTYPE)
