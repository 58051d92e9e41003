"""One layer of vLLM's CPU paged KV cache, read and written a request at a time (torch only, no vLLM).

vLLM's CPU attention backend keeps a layer's cache as [blocks, kv_heads, block_size, 2·head_dim]: per block and head,
block_size·head_dim values of K, then as many of V (vllm/v1/attention/backends/cpu_attn.py, vLLM 0.32:
`kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)`). V is stored a token per row,
[block_size, head_dim]; K is stored transposed, [head_dim, block_size] (its kernel reads keys column-wise). Measured
here, not documented: a prompt's cache in a vLLM instance against transformers' own cache of the same prompt
(SmolLM2, float32): token t, channel d of K sits at d·block_size + t of its block's K part, and reading K as a token
per row instead differed by up to 16.9 (V matched to 3e-7); with K read transposed both match (docs/engines.md).
A request's tokens sit in its blocks in order, block_size a block. kvtransit's connector (vllm_connector.py) hands a
request's layer to the link as [2·kv_heads, tokens, head_dim]: K's heads then V's, each a row of the whole token
sequence (the layout the middlebox's kernels work on).
"""

from __future__ import annotations

import torch


def _split_kv(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(K, V, block size) of one layer's paged cache, views: K [blocks, kv_heads, head_dim, block_size] (transposed,
    as stored), V [blocks, kv_heads, block_size, head_dim]."""
    blocks, heads, block_size, width = cache.shape
    head_dim = width // 2
    parts = cache.view(blocks, heads, 2, block_size * head_dim)
    return (parts[:, :, 0].view(blocks, heads, head_dim, block_size),
            parts[:, :, 1].view(blocks, heads, block_size, head_dim), block_size)


def gather_request_kv(cache: torch.Tensor, block_ids: list[int], tokens: int) -> torch.Tensor:
    """One request's first `tokens` tokens of one layer, float32 [2·kv_heads, tokens, head_dim] (K heads, V heads)."""
    k, v, block_size = _split_kv(cache)
    needed = -(-tokens // block_size)
    if len(block_ids) < needed:
        raise ValueError(f"{tokens} tokens need {needed} blocks of {block_size}, the request has {len(block_ids)}")
    index = torch.tensor(block_ids[:needed], dtype=torch.long)
    heads, head_dim = v.shape[1], v.shape[3]
    # K [n, H, hd, bs] and V [n, H, bs, hd] -> [H, n, bs, hd] -> [H, n*bs, hd] -> the first `tokens`
    keys = k[index].permute(1, 0, 3, 2).reshape(heads, needed * block_size, head_dim)[:, :tokens]
    values = v[index].permute(1, 0, 2, 3).reshape(heads, needed * block_size, head_dim)[:, :tokens]
    return torch.cat([keys, values], dim=0).to(torch.float32).contiguous()


def scatter_request_kv(cache: torch.Tensor, layer: torch.Tensor, block_ids: list[int], start: int,
                       tokens: int) -> None:
    """Write tokens [start, tokens) of one request's layer ([2·kv_heads, ≥ tokens, head_dim]) into its blocks."""
    k, v, block_size = _split_kv(cache)
    heads = v.shape[1]
    position = start
    while position < tokens:  # a block at a time: a run of tokens within one block, its K rows and its V rows
        block, offset = divmod(position, block_size)
        stop = min((block + 1) * block_size, tokens)
        target = block_ids[block]
        k[target, :, :, offset:offset + stop - position] = layer[:heads, position:stop].transpose(1, 2).to(cache.dtype)
        v[target, :, offset:offset + stop - position] = layer[heads:, position:stop].to(cache.dtype)
        position = stop
