"""Query-aware page scoring (Quest / PRISM style, docs/reference.md §7): one dot product per page, MAC only.

Keys are cut along tokens into pages of `page_size`; each page is represented by its mean key (a MAC:
sum and scale, no comparison, so it stays in the module's op set, unlike Quest's per-channel min/max).
A query scores every page with one dot product (2 flops per BF16 value = 1.00 op/byte, docs/reference.md §5).
Ranking the scores (top-k) is not a published operation: the host does it, so no top-k lives here.
"""

from __future__ import annotations

import numpy as np

from kvtransit.kernels.errors import KernelInputError


def page_representatives(keys: np.ndarray, page_size: int) -> np.ndarray:
    """[..., tokens, D] → [..., pages, D] mean key per page (a ragged last page averages what it has)."""
    if keys.ndim < 2:
        raise KernelInputError(f"page scoring needs [..., tokens, head_dim], got shape {keys.shape}")
    if page_size < 1:
        raise KernelInputError(f"page_size must be >= 1, got {page_size}")
    tokens = keys.shape[-2]
    full, tail = divmod(tokens, page_size)
    k = keys.astype(np.float32, copy=False)
    reps = []
    if full:
        body = k[..., : full * page_size, :].reshape((*k.shape[:-2], full, page_size, k.shape[-1]))
        reps.append(body.mean(axis=-2))
    if tail:
        reps.append(k[..., full * page_size :, :].mean(axis=-2, keepdims=True))
    return np.concatenate(reps, axis=-2)


def score_pages(query: np.ndarray, page_keys: np.ndarray) -> np.ndarray:
    """Dot product of `query` [..., D] with every page representative [..., pages, D] → [..., pages]."""
    if query.shape[-1] != page_keys.shape[-1]:
        raise KernelInputError(f"query head_dim {query.shape[-1]} != page key head_dim {page_keys.shape[-1]}")
    scores: np.ndarray = np.einsum("...d,...pd->...p", query.astype(np.float32, copy=False),
                                   page_keys.astype(np.float32, copy=False))
    return scores
