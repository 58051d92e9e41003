"""vLLM's CPU paged KV layout, read and written a request at a time (flows/engine/paged_layout.py). torch only;
skips where the realkv extra (torch) is missing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[realkv]'")

from kvtransit.flows.engine.paged_layout import gather_request_kv, scatter_request_kv  # noqa: E402

BLOCKS, HEADS, BLOCK, HEAD_DIM = 8, 3, 16, 4


def _cache() -> torch.Tensor:
    return torch.zeros(BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM)


def test_a_request_written_into_its_blocks_reads_back_unchanged():
    cache = _cache()
    tokens, blocks = 37, [5, 2, 7]  # three blocks, the last one partly filled, in no particular order
    layer = torch.randn(2 * HEADS, tokens, HEAD_DIM)
    scatter_request_kv(cache, layer, blocks, 0, tokens)
    assert torch.equal(gather_request_kv(cache, blocks, tokens), layer)
    untouched = [b for b in range(BLOCKS) if b not in blocks]
    assert not cache[untouched].any()


def test_k_sits_transposed_and_v_a_token_per_row_as_the_cpu_backend_stores_them():
    # Measured against transformers' cache (paged_layout.py): per block and head, K as [head_dim, block_size], then V
    # as [block_size, head_dim].
    cache = _cache()
    layer = torch.randn(2 * HEADS, BLOCK, HEAD_DIM)
    scatter_request_kv(cache, layer, [3], 0, BLOCK)
    stored = cache[3].reshape(HEADS, 2, BLOCK * HEAD_DIM)
    assert torch.equal(stored[:, 0].reshape(HEADS, HEAD_DIM, BLOCK), layer[:HEADS].transpose(1, 2))
    assert torch.equal(stored[:, 1].reshape(HEADS, BLOCK, HEAD_DIM), layer[HEADS:])


def test_a_load_from_a_later_token_leaves_the_earlier_ones_alone():
    cache = _cache()
    tokens, blocks = 40, [1, 4, 6]
    first, second = torch.randn(2 * HEADS, tokens, HEAD_DIM), torch.randn(2 * HEADS, tokens, HEAD_DIM)
    scatter_request_kv(cache, first, blocks, 0, tokens)
    scatter_request_kv(cache, second, blocks, 20, tokens)
    got = gather_request_kv(cache, blocks, tokens)
    assert torch.equal(got[:, :20], first[:, :20]) and torch.equal(got[:, 20:], second[:, 20:])
