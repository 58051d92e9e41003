"""The remote context every selection role agrees on, and the bytes of each leg (pure numpy; no I/O).

The context is the real-KV sample's (kernels/accuracy.py: SmolLM2-135M, [layers, kv_heads, T, D] per text), its
decode queries one a step: step s reads query s mod Tq at position p_s, over the context's tokens 0..p_s, cut into
pages of `page_size` (the tokens after the last whole page are always fetched, as kernels/selection.py's measure
does). It stands for the model's context (the scale is their bytes' ratio: flows/selection/run.py).

Legs (wire/group.py's kinds; each array raw on the wire in `wire_dtype`, shapes known to both ends):
- QUERY: the step's query [layers, q_heads, D];
- SUMMARIES: the whole pages' summaries (kernels/selection.py: page_summaries), mean [layers, kv_heads, pages, D]
  or Quest's [2 (min, max), layers, kv_heads, pages, D];
- SCORES: float32 [layers, kv_heads, pages] (the module's dot products; Quest's bound is scored by the host);
- FETCH: int32 page ids [layers, kv_heads, k] (empty: every token, no selection);
- PAGES: K and V of the chosen pages then the tail, [layers, 2, kv_heads, k × page_size + tail, D].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtransit.kernels.accuracy import KVSample, load_sample
from kvtransit.kernels.header import WIRE_DTYPES
from kvtransit.kernels.selection import PageSummaries, check_page_size, page_summaries, pages_for_budget

SCORE_DTYPE = np.dtype(np.float32)
PAGE_ID_DTYPE = np.dtype(np.int32)


class LegError(ValueError):
    """A leg's bytes are not what this step expects; the message says which leg and what was wrong."""


@dataclass(frozen=True)
class RemoteContext:
    sample: KVSample
    page_size: int
    wire_dtype: str = "float16"

    @classmethod
    def load(cls, path: str, text: str, page_size: int, wire_dtype: str = "float16") -> RemoteContext:
        samples = load_sample(path)
        if text not in samples:
            raise LegError(f"{path}: no text {text!r} (choose from: {', '.join(samples)})")
        if wire_dtype not in WIRE_DTYPES:
            raise LegError(f"unknown wire dtype {wire_dtype!r} (choose from: {', '.join(WIRE_DTYPES)})")
        ctx = cls(samples[text], page_size, wire_dtype)
        if ctx.sample.q is None or ctx.sample.q_positions is None:
            raise LegError(f"{path}: text {text!r} has no decode queries to select for")
        check_page_size(ctx.sample.k.shape[2], page_size)
        return ctx

    @property
    def wire(self) -> np.dtype:
        return WIRE_DTYPES[self.wire_dtype]

    @property
    def layers(self) -> int:
        return int(self.sample.k.shape[0])

    @property
    def kv_heads(self) -> int:
        return int(self.sample.k.shape[1])

    @property
    def head_dim(self) -> int:
        return int(self.sample.k.shape[3])

    @property
    def tokens(self) -> int:
        return int(self.sample.k.shape[2])

    def position(self, step: int) -> int:
        assert self.sample.q_positions is not None
        return int(self.sample.q_positions[step % self.sample.q_positions.size])

    def pages(self, step: int) -> int:
        """Whole pages of the step's context (tokens 0..p_s)."""
        return (self.position(step) + 1) // self.page_size

    def tail(self, step: int) -> int:
        return self.position(step) + 1 - self.pages(step) * self.page_size

    def chosen(self, step: int, budget: float) -> int:
        return pages_for_budget(self.pages(step), budget)

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.wire.itemsize

    # --- the legs -----------------------------------------------------------------------------------------

    def query(self, step: int) -> np.ndarray:
        """[layers, q_heads, D] float32: the step's query as it crosses (rounded to the wire dtype)."""
        assert self.sample.q is not None
        q = self.sample.q[:, :, step % self.sample.q.shape[2]]
        return q.astype(self.wire).astype(np.float32)

    def query_bytes(self, step: int) -> bytes:
        return self.query(step).astype(self.wire).tobytes()

    def query_from(self, data: bytes, step: int) -> np.ndarray:
        assert self.sample.q is not None
        shape = (self.layers, self.sample.q.shape[1], self.head_dim)
        return self._array(data, self.wire, shape, "QUERY", step).astype(np.float32)

    def summaries(self, step: int, kind: str) -> PageSummaries:
        """The whole pages' summaries, as the pool sends them (rounded to the wire dtype)."""
        paged = self.pages(step) * self.page_size
        s = page_summaries(self.sample.k[..., :paged, :], self.page_size, kind)
        def wire(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a.astype(self.wire).astype(np.float64)
        return PageSummaries(kind, self.page_size, wire(s.mean), wire(s.low), wire(s.high))

    def summary_bytes(self, step: int, kind: str) -> bytes:
        s = self.summaries(step, kind)
        parts = [s.mean] if kind == "mean" else [s.low, s.high]
        return b"".join(np.ascontiguousarray(p).astype(self.wire).tobytes() for p in parts if p is not None)

    def summary_size(self, step: int, kind: str) -> int:
        """Bytes of the step's summaries on the wire (one vector a page and kv head, two for Quest's)."""
        vectors = 1 if kind == "mean" else 2
        return vectors * self.layers * self.kv_heads * self.pages(step) * self.head_dim * self.wire.itemsize

    def summaries_from(self, data: bytes, step: int, kind: str) -> PageSummaries:
        shape = (self.layers, self.kv_heads, self.pages(step), self.head_dim)
        if kind == "mean":
            return PageSummaries(kind, self.page_size, mean=self._array(data, self.wire, shape, "SUMMARIES", step))
        both = self._array(data, self.wire, (2, *shape), "SUMMARIES", step)
        return PageSummaries(kind, self.page_size, low=both[0], high=both[1])

    def scores_from(self, data: bytes, step: int) -> np.ndarray:
        return self._array(data, SCORE_DTYPE, (self.layers, self.kv_heads, self.pages(step)), "SCORES", step)

    def ids_from(self, data: bytes, step: int) -> np.ndarray | None:
        """The page ids a FETCH asks for, checked to be this step's pages; None: every token."""
        if not data:
            return None
        ids = np.frombuffer(data, PAGE_ID_DTYPE)
        per = self.layers * self.kv_heads
        if ids.size % per or not ids.size:
            raise LegError(f"FETCH at step {step}: {ids.size} page ids do not split over {self.layers} layers x "
                           f"{self.kv_heads} kv heads")
        ids = ids.reshape(self.layers, self.kv_heads, -1)
        if ids.min() < 0 or ids.max() >= self.pages(step):
            raise LegError(f"FETCH at step {step}: page ids {ids.min()}..{ids.max()} outside the context's "
                           f"{self.pages(step)} whole pages")
        return ids

    def pages_payload(self, step: int, ids: np.ndarray | None) -> np.ndarray:
        """[layers, 2, kv_heads, tokens, D] in the wire dtype: the chosen pages' K and V, then the tail; all of
        tokens 0..p_s when `ids` is None."""
        end = self.position(step) + 1
        kv = np.stack([self.sample.k[..., :end, :], self.sample.v[..., :end, :]], axis=1)  # [L, 2, kvh, T, D]
        if ids is None:
            return kv.astype(self.wire)
        paged = self.pages(step) * self.page_size
        token_ids = (ids[..., None] * self.page_size + np.arange(self.page_size)).reshape(*ids.shape[:2], -1)
        chosen = np.take_along_axis(kv[..., :paged, :], token_ids[:, None, :, :, None], axis=3)
        return np.concatenate([chosen, kv[..., paged:end, :]], axis=3).astype(self.wire)

    def pages_from(self, data: bytes, step: int, chosen: int | None) -> np.ndarray:
        tokens = self.position(step) + 1 if chosen is None else chosen * self.page_size + self.tail(step)
        shape = (self.layers, 2, self.kv_heads, tokens, self.head_dim)
        return self._array(data, self.wire, shape, "PAGES", step).astype(np.float32)

    def _array(self, data: bytes, dtype: np.dtype, shape: tuple[int, ...], leg: str, step: int) -> np.ndarray:
        expected = int(np.prod(shape)) * dtype.itemsize
        if len(data) != expected:
            raise LegError(f"{leg} at step {step}: {len(data)} B, expected {expected} B for {shape} {dtype}")
        return np.frombuffer(data, dtype).reshape(shape)
