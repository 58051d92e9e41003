"""Query-aware KV selection, measured (Quest arXiv:2406.10774, PRISM arXiv:2603.21576; docs/reference.md §7).

The context's keys are cut along tokens into pages of `page_size` (16, Quest's). Each page gets a summary of
one of two kinds (`SUMMARY_KINDS`):

* ``mean``: one representative key, the page's mean (`page_scoring.page_representatives`). Scoring it is one dot
  product per page: 2 FLOPs per BF16 value = 1.00 op/B of MAC, in the module's published set.
* ``minmax``: Quest's element-wise min and max key; the score is the upper bound Σ_d max(q_d·min_d, q_d·max_d).
  The products are MACs, but the per-channel max is a comparison: not published, so it runs on the host.

Scores are computed at the analogue path's `precision_bits` (docs/reference.md §5: "what the analogue path delivers";
PRISM argues ranking needs only 4–6 bits): both operands (the query, each summary vector) and the result are
rounded to a `bits`-bit symmetric uniform grid whose full scale is that vector's largest |value|, the same
quantiser band-keep's precision model uses (`bandkeep._add_precision_noise`: FS = max |x|, Δ = 2·FS / 2^bits),
rounded rather than dithered so that a ranking is reproducible. ``None`` is full precision (float64).

The host ranks: `top_k_pages` keeps the highest scores, ties to the lower page index, and fetches those pages.
`evaluate_selection` then measures, against attention over every key, what the chosen pages keep: the
attention-mass recall (mass on the chosen pages / mass on all pages) and the attention-output error
‖O_sel − O‖ / ‖O‖ (O = softmax(q·Kᵀ/√d)·V).

Pure: numpy only, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvtransit.kernels.errors import KernelInputError

SUMMARY_KINDS: tuple[str, ...] = ("mean", "minmax")
DEFAULT_PAGE_SIZE = 16  # Quest's page (docs/reference.md §7)
# The page budgets measured: fractions of the context's pages fetched (docs/reference.md §7.5: PRISM's 1/16 among
# them).
BUDGETS: tuple[float, ...] = (1 / 4, 1 / 8, 1 / 16)
# Scoring precisions measured: 4, 6, 8 bits (PRISM: 4–6 may do; docs/reference.md §5's example is 8) and full (None).
PRECISION_BITS: tuple[int | None, ...] = (4, 6, 8, None)


@dataclass(frozen=True)
class PageSummaries:
    """One context's page summaries: `mean` [..., pages, D], or `low`/`high` [..., pages, D] (Quest)."""

    kind: str
    page_size: int
    mean: np.ndarray | None = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    @property
    def pages(self) -> int:
        first = self.mean if self.mean is not None else self.low
        assert first is not None  # built by page_summaries, which sets one or the other
        return int(first.shape[-2])

    @property
    def vectors_per_page(self) -> int:
        """Summary vectors per page and head: what crosses the link per page (1 mean, or a min and a max)."""
        return 1 if self.kind == "mean" else 2


def check_page_size(tokens: int, page_size: int) -> None:
    """The context must be whole pages: a KernelInputError naming the valid page sizes otherwise."""
    if page_size < 1 or tokens < 1 or tokens % page_size:
        valid = [p for p in range(1, tokens + 1) if tokens % p == 0] if tokens >= 1 else []
        raise KernelInputError(f"page size {page_size} does not divide the context's {tokens} tokens "
                               f"(valid page sizes: {', '.join(map(str, valid)) or 'none: empty context'})")


def check_summary_kind(kind: str) -> None:
    if kind not in SUMMARY_KINDS:
        raise KernelInputError(f"unknown summary kind {kind!r} (choose from: {', '.join(SUMMARY_KINDS)})")


def check_precision_bits(bits: int | None) -> None:
    if bits is not None and not (isinstance(bits, int) and 2 <= bits <= 32):
        raise KernelInputError(f"precision_bits must be an integer in 2..32 or None (full), got {bits!r}")


def pages_for_budget(pages: int, budget: float) -> int:
    """How many pages a budget (a fraction of the pages, in (0, 1]) fetches: ⌈budget × pages⌉, at least 1."""
    if not 0 < budget <= 1:  # also rejects NaN
        raise KernelInputError(f"page budget must be a fraction in (0, 1] (e.g. "
                               f"{', '.join(f'1/{round(1 / b)}' for b in BUDGETS)}), got {budget!r}")
    if pages < 1:
        raise KernelInputError(f"a selection needs at least one page, got {pages}")
    return max(1, math.ceil(budget * pages - 1e-9))


def page_summaries(keys: np.ndarray, page_size: int = DEFAULT_PAGE_SIZE, kind: str = "mean") -> PageSummaries:
    """keys [..., tokens, D] (tokens a multiple of page_size) → the pages' summaries of `kind`, float64."""
    check_summary_kind(kind)
    if keys.ndim < 2:
        raise KernelInputError(f"page summaries need keys [..., tokens, head_dim], got shape {keys.shape}")
    tokens = keys.shape[-2]
    check_page_size(tokens, page_size)
    paged = keys.astype(np.float64).reshape((*keys.shape[:-2], tokens // page_size, page_size, keys.shape[-1]))
    if kind == "mean":
        return PageSummaries(kind, page_size, mean=paged.mean(axis=-2))
    return PageSummaries(kind, page_size, low=paged.min(axis=-2), high=paged.max(axis=-2))


def quantise(x: np.ndarray, bits: int | None) -> np.ndarray:
    """Round each vector (last axis) to a `bits`-bit symmetric grid, full scale = its largest |value|.

    Δ = 2·FS / 2^bits (the ENOB quantiser of `bandkeep._add_precision_noise`); None: unchanged (float64)."""
    check_precision_bits(bits)
    x = x.astype(np.float64)
    if bits is None:
        return x
    full_scale = np.abs(x).max(axis=-1, keepdims=True)
    step = 2.0 * full_scale / 2.0**bits
    safe = np.where(step > 0, step, 1.0)
    out: np.ndarray = np.where(step > 0, np.round(x / safe) * safe, 0.0)
    return out


def score_pages(query: np.ndarray, summaries: PageSummaries, precision_bits: int | None = None) -> np.ndarray:
    """query [..., D] against summaries [..., pages, D] → scores [..., pages] at `precision_bits`.

    mean: q·k̄ (MAC). minmax: Σ_d max(q_d·min_d, q_d·max_d) (Quest's bound; the max is a comparison).
    Operands and result are each quantised (module docstring); the result's full scale is per query."""
    check_precision_bits(precision_bits)
    ref = summaries.mean if summaries.kind == "mean" else summaries.low
    assert ref is not None
    if query.shape[-1] != ref.shape[-1]:
        raise KernelInputError(f"query head_dim {query.shape[-1]} != page summary head_dim {ref.shape[-1]}")
    if not np.isfinite(query).all():
        raise KernelInputError("query has NaN/Inf values")
    q = quantise(query, precision_bits)[..., None, :]  # [..., 1, D]
    if summaries.kind == "mean":
        assert summaries.mean is not None
        scores = np.sum(q * quantise(summaries.mean, precision_bits), axis=-1)
    else:
        assert summaries.low is not None and summaries.high is not None
        scores = np.maximum(q * quantise(summaries.low, precision_bits),
                            q * quantise(summaries.high, precision_bits)).sum(axis=-1)
    return quantise(scores, precision_bits)


def top_k_pages(scores: np.ndarray, k: int) -> np.ndarray:
    """The host's ranking: the k best pages per row of scores [..., pages], highest first, ties to the lower
    page index (a stable sort of −score); returned in ascending page order, [..., k]."""
    pages = scores.shape[-1]
    if not 1 <= k <= pages:
        raise KernelInputError(f"top-k: k must be in 1..{pages} (the pages scored), got {k}")
    if not np.isfinite(scores).all():
        raise KernelInputError("top-k: scores have NaN/Inf values")
    # = np.sort(np.argsort(-scores, kind="stable")[..., :k]), in O(pages) a row instead of a sort (2.5-3.8x faster,
    # benchmarks/remote_legs_host.py: decode ranks every step, and its host time counts against the legs' model):
    # every score above the k-th largest, then the lowest-indexed of those equal to it until there are k.
    kth = np.partition(scores, pages - k, axis=-1)[..., pages - k:pages - k + 1]
    above, tied = scores > kth, scores == kth
    room = k - above.sum(axis=-1, keepdims=True)
    keep = above | (tied & (np.cumsum(tied, axis=-1) <= room))
    out: np.ndarray = np.nonzero(keep)[-1].reshape(*scores.shape[:-1], k)  # row-major: ascending page order
    return out


def select_pages(queries: np.ndarray, keys: np.ndarray, budget: float, *, kind: str = "mean",
                 page_size: int = DEFAULT_PAGE_SIZE, precision_bits: int | None = None,
                 sink_pages: int = 0) -> np.ndarray:
    """Pages [kv_heads, k] chosen for queries [q_heads, D] over keys [kv_heads, tokens, D] (GQA).

    One selection per kv head (the pages are fetched per kv head), over the query heads that read it (query head h
    reads kv head h // group, as transformers' repeat_kv), scored by the sum of their scores. For the mean summary
    that sum is the summed query's dot product (Σ_h q_h·k̄ = (Σ_h q_h)·k̄), so the module makes one dot product per
    summary value, 1.00 op/B, whatever the group; Quest's bound is not linear in q, so each head is bounded and
    the bounds summed. `sink_pages`: the first pages are always kept, within the budget (the attention sinks,
    docs/reference.md §6: SmolLM2's first token held about 43 % of the attention mass); Quest keeps none (0)."""
    kv_heads = keys.shape[0]
    if queries.ndim != 2 or keys.ndim != 3 or queries.shape[0] % kv_heads:
        raise KernelInputError(f"select_pages needs queries [q_heads, D] and keys [kv_heads, tokens, D] with q_heads "
                               f"a multiple of kv_heads, got {queries.shape} and {keys.shape}")
    summaries = page_summaries(keys, page_size, kind)
    return rank_pages(group_scores(queries, summaries, precision_bits), budget, sink_pages)


def group_scores(queries: np.ndarray, summaries: PageSummaries, precision_bits: int | None = None) -> np.ndarray:
    """Scores [..., kv_heads, pages] of queries [..., q_heads, D] against summaries [..., kv_heads, pages, D]: each
    kv head's pages scored for the query heads that read it (GQA; see `select_pages`). The mean's is what the
    module computes (one dot product of the summed query a summary value); Quest's bound is the host's."""
    ref = summaries.mean if summaries.kind == "mean" else summaries.low
    assert ref is not None
    kv_heads = ref.shape[-3]
    if queries.shape[-2] % kv_heads:
        raise KernelInputError(f"query heads {queries.shape[-2]} are not a multiple of kv heads {kv_heads}")
    group = queries.shape[-2] // kv_heads
    grouped = queries.astype(np.float64).reshape(*queries.shape[:-2], kv_heads, group, queries.shape[-1])
    if summaries.kind == "mean":
        return score_pages(grouped.sum(axis=-2), summaries, precision_bits)
    scores: np.ndarray = score_pages(grouped, _broadcast_heads(summaries), precision_bits).sum(axis=-2)
    return scores


def rank_pages(scores: np.ndarray, budget: float, sink_pages: int = 0) -> np.ndarray:
    """The host's part: the ⌈budget × pages⌉ best pages of scores [..., pages] (`sink_pages` first pages forced
    within the budget), [..., k] in ascending page order."""
    k = pages_for_budget(scores.shape[-1], budget)
    if sink_pages < 0:
        raise KernelInputError(f"sink_pages must be >= 0, got {sink_pages}")
    forced = min(sink_pages, k)
    scores = scores.copy()
    scores[..., :forced] = np.finfo(np.float64).max  # ranked first by the host (ties: the lower page)
    return top_k_pages(scores, k)


def _broadcast_heads(s: PageSummaries) -> PageSummaries:
    """[..., kv_heads, pages, D] → [..., kv_heads, 1, pages, D], so a group of queries [..., kv_heads, group, D]
    scores it."""
    def lift(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[..., None, :, :]
    return PageSummaries(s.kind, s.page_size, lift(s.mean), lift(s.low), lift(s.high))


@dataclass(frozen=True)
class SelectionQuality:
    """What a selection keeps, over every layer, query head and query: recall = mean attention-mass share of the
    chosen pages; output_error = ‖O_sel − O‖ / ‖O‖ (Frobenius over all outputs)."""

    recall: float
    output_error: float
    pages: float  # mean pages per selection (whole pages of the context up to each query)
    chosen: float  # mean pages chosen


def evaluate_selection(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, budget: float, *,
                       kind: str = "mean", page_size: int = DEFAULT_PAGE_SIZE,
                       precision_bits: int | None = None, sink_pages: int = 0) -> SelectionQuality:
    """q [layers, q_heads, Tq, D] at `positions` [Tq]; k, v [layers, kv_heads, T, D]; causal.

    For a query at position p the pages are the whole pages of keys 0..p; the keys after the last whole page
    (the page decode is still writing, local to it) are always attended and count in neither side of the
    recall. Each query selects for itself (one decode step each)."""
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or q.shape[0] != k.shape[0]:
        raise KernelInputError(f"evaluate_selection needs q [layers, q_heads, Tq, D], k and v [layers, kv_heads, T, D] "
                               f"of the same layers, got {q.shape}, {k.shape}, {v.shape}")
    layers, q_heads, tq, d = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    recall_sum, num, den = 0.0, 0.0, 0.0
    pages_seen, chosen_seen = 0, 0
    for t in range(tq):
        pos = int(positions[t])
        if not 0 <= pos < k.shape[2]:
            raise KernelInputError(f"query position {pos} is outside the context's {k.shape[2]} tokens")
        pages = (pos + 1) // page_size
        paged = pages * page_size
        for layer in range(layers):
            kk = k[layer, :, : pos + 1].astype(np.float64)
            vv = v[layer, :, : pos + 1].astype(np.float64)
            qq = q[layer, :, t].astype(np.float64)  # [q_heads, D]
            w = _softmax(np.einsum("hd,htd->ht", qq, np.repeat(kk, group, axis=0)) / math.sqrt(d))  # [q_heads, T]
            out = np.einsum("ht,htd->hd", w, np.repeat(vv, group, axis=0))
            keep = np.ones((kv_heads, pos + 1), bool)
            if pages:
                chosen = select_pages(qq, kk[:, :paged], budget, kind=kind, page_size=page_size,
                                      precision_bits=precision_bits, sink_pages=sink_pages)
                page_mask = np.zeros((kv_heads, pages), bool)
                np.put_along_axis(page_mask, chosen, True, axis=-1)
                keep[:, :paged] = np.repeat(page_mask, page_size, axis=-1)
                pages_seen += pages
                chosen_seen += chosen.shape[-1]
            keep_q = np.repeat(keep, group, axis=0)  # [q_heads, T]
            mass_all = w[:, :paged].sum(axis=-1)
            mass_kept = (w[:, :paged] * keep_q[:, :paged]).sum(axis=-1)
            recall_sum += float(np.sum(np.where(mass_all > 0, mass_kept / np.where(mass_all > 0, mass_all, 1), 1.0)))
            ws = np.where(keep_q, w, 0.0)
            got = np.einsum("ht,htd->hd", ws / ws.sum(axis=-1, keepdims=True), np.repeat(vv, group, axis=0))
            num += float(np.sum((got - out) ** 2))
            den += float(np.sum(out**2))
    count = tq * layers * q_heads
    return SelectionQuality(recall_sum / count, math.sqrt(num / den) if den else 0.0,
                            pages_seen / max(1, tq * layers), chosen_seen / max(1, tq * layers))


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


@dataclass(frozen=True)
class NeedleTrial:
    """Whether a planted key's page was chosen, and its rank among the pages (0 = the best)."""

    found: bool
    rank: int
    pages: int
    chosen: int


def needle_context(tokens: int, head_dim: int, seed: int, strength: float = 2.0
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """Synthetic keys [1, tokens, D] (white Gaussian, unit variance) with one planted needle, and its query [1, D].

    The needle is `strength`·√D along the query's direction (a typical key has ‖k‖ ≈ √D), at a seeded token: its
    logit q·k/√D is strength·‖q‖ ≈ strength·√D (16 at D = 64), the others' ≈ N(0, 1), so exact attention puts
    nearly all its mass on it; the question is whether a page summary finds it. → (keys, query, needle token)."""
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((1, tokens, head_dim))
    query = rng.standard_normal((1, head_dim))
    at = int(rng.integers(0, tokens))
    keys[0, at] = strength * math.sqrt(head_dim) * query[0] / np.linalg.norm(query[0])
    return keys, query, at


def needle_trial(keys: np.ndarray, query: np.ndarray, needle_at: int, budget: float, *, kind: str = "mean",
                 page_size: int = DEFAULT_PAGE_SIZE, precision_bits: int | None = None) -> NeedleTrial:
    """Score every page for `query`, rank on the host, and say whether the needle's page is among the chosen."""
    summaries = page_summaries(keys, page_size, kind)
    scores = score_pages(query, summaries, precision_bits)[0]  # one head
    k = pages_for_budget(summaries.pages, budget)
    chosen = top_k_pages(scores, k)
    page = needle_at // page_size
    rank = int(np.argsort(-scores, kind="stable").tolist().index(page))
    return NeedleTrial(bool(page in chosen), rank, summaries.pages, k)
