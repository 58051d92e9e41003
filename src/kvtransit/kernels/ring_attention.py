"""Ring attention's KV blocks, measured (Liu et al., arXiv:2310.01889; docs/reference.md §7).

A prompt's KV is split along tokens into n blocks, block j held by rank j. Each layer, every rank passes the block
it holds to the next rank and computes blockwise attention for its own queries on the block it has, n steps in
all: the block of rank j reaches rank i after (i − j) mod n hops, so each rank sends n − 1 times per layer
(`hops_per_layer`). Attention is exact: each rank keeps a running max, sum and weighted value sum (the online
softmax of FlashAttention, Dao et al. arXiv:2205.14135; Milakov & Gimelshein arXiv:1805.02867), so in float64 the
result equals full attention (`ring_attention(..., codec=None)`).

A lossy codec on the ring's links is applied once per hop to the block in flight (docs/reference.md §7): the block rank
i attends to after h hops has been encoded and decoded h times (`BlockCodec`). `versions_after_hops` makes those
versions; `ring_attention` uses them as the ring would; `error_after_hops` measures the attention-output error when
every block has gone h hops, against the error of one pass (h = 1: the codec applied once, as a hand-off).

Pure: numpy (and the codecs of `registry`), no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.header import WIRE_DTYPES
from kvtransit.kernels.registry import get_codec

# A codec applied to one block in flight: (kv [layers, 2, kv_heads, tokens, D] float32, hop number 1..n−1) → kv.
BlockCodec = Callable[[np.ndarray, int], np.ndarray]
RING_SIZES: tuple[int, ...] = (2, 4, 8)  # ring sizes measured (docs/reference.md §7.6)


def hops_per_layer(n: int) -> int:
    """Each rank sends its block on n − 1 times a layer, so every query block sees every KV block once."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KernelInputError(f"ring size must be an integer >= 1, got {n!r}")
    return n - 1


def block_bounds(tokens: int, n: int) -> list[tuple[int, int]]:
    """[start, end) of each rank's block: n equal blocks (tokens a multiple of n)."""
    hops_per_layer(n)
    if tokens < n or tokens % n:
        valid = [r for r in RING_SIZES if tokens % r == 0 and tokens >= r]
        raise KernelInputError(f"ring of {n} ranks cannot split {tokens} tokens into equal blocks "
                               f"(ring sizes that do: {', '.join(map(str, valid)) or 'none of ' + str(RING_SIZES)})")
    size = tokens // n
    return [(j * size, (j + 1) * size) for j in range(n)]


def wire_codec(name: str, dtype: str = "bfloat16", **params: object) -> BlockCodec:
    """A registry codec as the ring link runs it: cast to the wire dtype, encode, decode, back to float32.

    A band-keep codec with `precision_bits` draws its analogue noise afresh on every hop (seed = the hop number):
    each hop is another pass through the optics, not a replay of the first."""
    wire = WIRE_DTYPES[dtype]

    def run(kv: np.ndarray, hop: int) -> np.ndarray:
        extra = dict(params)
        if name == "freq-keep-k":
            extra["seed"] = hop
        codec = get_codec(name, **extra)  # type: ignore[arg-type]
        enc = codec.encode(np.ascontiguousarray(kv.astype(wire)))
        out: np.ndarray = codec.decode(enc.header, enc.payload).astype(np.float32)
        return out

    return run


def versions_after_hops(k: np.ndarray, v: np.ndarray, bounds: Sequence[tuple[int, int]], codec: BlockCodec | None,
                        hops: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """versions[j][h] = block j's (K, V) after h passes through the codec (h = 0: as held), h = 0..hops.

    k, v [layers, kv_heads, T, D]; K and V of a block travel together, as one [layers, 2, kv_heads, t, D] frame."""
    out = []
    for start, end in bounds:
        kb, vb = k[..., start:end, :], v[..., start:end, :]
        chain = [(kb, vb)]
        for h in range(1, hops + 1):
            if codec is None:
                chain.append((kb, vb))
                continue
            frame = codec(np.stack([chain[-1][0], chain[-1][1]], axis=1), h)
            chain.append((frame[:, 0], frame[:, 1]))
        out.append(chain)
    return out


@dataclass
class _Running:
    """One rank's online softmax state for its queries [q_heads, Tq]: running max m, sum l, and Σ w·v."""

    m: np.ndarray
    l: np.ndarray  # noqa: E741 (the papers' name)
    acc: np.ndarray

    @classmethod
    def empty(cls, q_heads: int, tq: int, d: int) -> _Running:
        return cls(np.full((q_heads, tq), -np.inf), np.zeros((q_heads, tq)), np.zeros((q_heads, tq, d)))

    def update(self, scores: np.ndarray, vv: np.ndarray) -> None:
        """Fold one block in: scores [q_heads, Tq, t] (−inf where masked), vv [q_heads, t, D]."""
        block_max = scores.max(axis=-1)
        m_new = np.maximum(self.m, block_max)
        finite = np.isfinite(m_new)  # a query that has seen no key yet (all masked) keeps its empty state
        safe = np.where(finite, m_new, 0.0)
        scale = np.where(finite & np.isfinite(self.m), np.exp(self.m - safe), 0.0)
        p = np.where(finite[..., None], np.exp(scores - safe[..., None]), 0.0)
        self.l = self.l * scale + p.sum(axis=-1)
        self.acc = self.acc * scale[..., None] + np.einsum("hqt,htd->hqd", p, vv)
        self.m = m_new

    def output(self) -> np.ndarray:
        if not (self.l > 0).all():
            raise KernelInputError("a query attended to no key (is its position before the context's first token?)")
        out: np.ndarray = self.acc / self.l[..., None]
        return out


def blockwise_attention(q: np.ndarray, positions: np.ndarray,
                        blocks: Sequence[tuple[np.ndarray, np.ndarray, int]]) -> np.ndarray:
    """softmax(q·Kᵀ/√d)·V over KV blocks visited one at a time (online softmax), causal, GQA, float64.

    q [q_heads, Tq, D] at positions [Tq]; blocks: (K, V [kv_heads, t, D], first token position). → [q_heads, Tq, D]."""
    q_heads, tq, d = q.shape
    state = _Running.empty(q_heads, tq, d)
    q64 = q.astype(np.float64)
    for kb, vb, start in blocks:
        if q_heads % kb.shape[0]:
            raise KernelInputError(f"query heads {q_heads} are not a multiple of kv heads {kb.shape[0]}")
        group = q_heads // kb.shape[0]
        kk = np.repeat(kb.astype(np.float64), group, axis=0)
        vv = np.repeat(vb.astype(np.float64), group, axis=0)
        scores = np.einsum("hqd,htd->hqt", q64, kk) / math.sqrt(d)
        kpos = start + np.arange(kb.shape[1])
        scores = np.where(kpos[None, None, :] <= positions[None, :, None], scores, -np.inf)
        state.update(scores, vv)
    return state.output()


@dataclass(frozen=True)
class RingResult:
    """Every query's output (in the order given), and the ring's hop count per layer."""

    output: np.ndarray  # [layers, q_heads, Tq, D]
    hops_per_layer: int


def ring_attention(q: np.ndarray, positions: np.ndarray, k: np.ndarray, v: np.ndarray, n: int,
                   codec: BlockCodec | None = None) -> RingResult:
    """Ring attention of q [layers, q_heads, Tq, D] at `positions` over k, v [layers, kv_heads, T, D] on n ranks.

    Each query belongs to the rank holding its position's block; rank i visits blocks i, i−1, …, i−n+1 (mod n),
    block j arriving after (i − j) mod n hops, each hop one pass through `codec` (None: exact)."""
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or q.shape[0] != k.shape[0]:
        raise KernelInputError(f"ring attention needs q [layers, q_heads, Tq, D], k and v [layers, kv_heads, T, D] "
                               f"of the same layers, got {q.shape}, {k.shape}, {v.shape}")
    tokens = k.shape[2]
    bounds = block_bounds(tokens, n)
    hops = hops_per_layer(n)
    versions = versions_after_hops(k, v, bounds, codec, hops)
    if positions.min() < 0 or positions.max() >= tokens:
        raise KernelInputError(f"query positions must be in 0..{tokens - 1}, got {positions.min()}..{positions.max()}")
    block_size = tokens // n
    owner = positions // block_size
    out = np.zeros(q.shape, np.float64)
    for rank in range(n):
        mine = np.flatnonzero(owner == rank)
        if not mine.size:
            continue  # a rank without queries still passes its block on (the hops are counted all the same)
        for layer in range(q.shape[0]):
            visits = []
            for step in range(n):
                j = (rank - step) % n
                kb, vb = versions[j][step]  # block j has travelled `step` hops to reach this rank
                visits.append((kb[layer], vb[layer], bounds[j][0]))
            out[layer][:, mine] = blockwise_attention(q[layer][:, mine], positions[mine], visits)
    return RingResult(out, hops)


def full_attention(q: np.ndarray, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One-shot softmax(q·Kᵀ/√d)·V over all of k, v (causal, GQA, float64): the reference. Shapes as ring_attention."""
    out = np.empty(q.shape, np.float64)
    for layer in range(q.shape[0]):
        out[layer] = blockwise_attention(q[layer], positions, [(k[layer], v[layer], 0)])
    return out


def relative_l2(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@dataclass(frozen=True)
class HopErrors:
    """Attention-output error against exact attention: when every block has gone h hops (h = 1..n−1; index 0 is
    h = 1 = one pass, the codec applied once), and the ring's own output (each block as far as it travelled)."""

    n: int
    after_hops: tuple[float, ...]
    ring: float
    kv_after_hops: tuple[float, ...]  # ‖KV_h − KV‖ / ‖KV‖, the blocks' own reconstruction error after h passes

    @property
    def one_pass(self) -> float:
        return self.after_hops[0]


def error_after_hops(q: np.ndarray, positions: np.ndarray, k: np.ndarray, v: np.ndarray, n: int,
                     codec: BlockCodec) -> HopErrors:
    """The accumulation a codec on every hop costs (module docstring), on one ring of n ranks (n >= 2)."""
    hops = hops_per_layer(n)
    if hops < 1:
        raise KernelInputError(f"a ring of {n} rank has no hop to measure "
                               f"(ring sizes: {', '.join(map(str, RING_SIZES))})")
    bounds = block_bounds(k.shape[2], n)
    versions = versions_after_hops(k, v, bounds, codec, hops)
    exact = full_attention(q, positions, k, v)
    kv_ref = np.stack([k, v]).astype(np.float64)
    after, kv_err = [], []
    for h in range(1, hops + 1):
        kh = np.concatenate([versions[j][h][0] for j in range(n)], axis=2)
        vh = np.concatenate([versions[j][h][1] for j in range(n)], axis=2)
        after.append(relative_l2(exact, full_attention(q, positions, kh, vh)))
        kv_err.append(relative_l2(kv_ref, np.stack([kh, vh]).astype(np.float64)))
    ring = ring_attention(q, positions, k, v, n, codec)
    return HopErrors(n, tuple(after), relative_l2(exact, ring.output), tuple(kv_err))
