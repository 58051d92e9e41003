"""A write-back's blocks as KV chunks: the one layout the prefill sends and a warmed pool stores.

A block is `block_tokens` tokens of every layer's K and V rows, [layers·2·kv_heads, block_tokens, head_dim], cut
into chunks of at most kv_frames.MAX_CHUNK_BYTES (so a block is a few large frames, not one small frame per layer:
per-frame host overhead would otherwise pace a fast link). The codec works along tokens, row by row, so any run of
rows is a valid chunk.

The codec a write-back runs (`write_back_codec`) is where the scenario compresses: in transit the middlebox's
kernel (`transit_codec`, the one `agents/middlebox/stages/kernel.py: activate` builds), at the GPU the prefill's
(kv_frames.codec_for). Its output is the same bytes wherever it runs: `tests/integration/flows/tier/test_pool_warm.py`
holds a warmed block equal to one written back through a real middlebox.
"""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np

from kvtransit.agents.common import kv_frames
from kvtransit.model.scenario import Scenario
from kvtransit.wire import crc32c
from kvtransit.wire.events import KvChunk


def block_chunks(kv, request_id: int, first: int, last: int, *, layers: int, block_tokens: int) -> list[KvChunk]:
    """Raw chunks of blocks first..last-1 of `request_id`'s KV (`kv`: the sender's SyntheticKv), block by block."""
    B = block_tokens
    # Only the blocks written: the tokens before them are the cached prefix, which the write-back does not carry.
    rows = [kv_frames.as_rows(kv.layer(request_id, layer, (last - first) * B, first=first * B))
            for layer in range(layers)]
    rows_per_block = rows[0].shape[0] * len(rows)
    pieces = kv_frames.row_slices(1, rows_per_block, B * rows[0].shape[2] * rows[0].itemsize)
    chunks: list[KvChunk] = []
    for k in range(last - first):
        block = np.concatenate([r[:, k * B:(k + 1) * B, :] for r in rows])
        for piece in pieces:
            chunks.append(kv_frames.raw_chunk(request_id, len(chunks), piece, block))
    return chunks


def write_back_chunks(kv, request_id: int, first: int, last: int, *, layers: int, block_tokens: int, codec,
                      codec_name: str) -> list[KvChunk]:
    """`block_chunks` as a write-back sends them: raw (`codec` None), or each through `codec` (named `codec_name`)."""
    chunks = block_chunks(kv, request_id, first, last, layers=layers, block_tokens=block_tokens)
    return chunks if codec is None else [encoded(c, codec, codec_name) for c in chunks]


def write_back_codec(scenario: Scenario):
    """The codec a write-back's blocks are stored with, wherever it runs (None: stored raw)."""
    if scenario.compress_at == "gpu":
        return kv_frames.codec_for(scenario)
    return kv_frames.transit_codec(scenario.codec, keep=scenario.keep, block=scenario.block, sinks=scenario.sinks,
                         variant=scenario.variant, precision_bits=scenario.precision_bits)


def encoded(chunk: KvChunk, codec, name: str) -> KvChunk:
    """`chunk` (raw) through `codec`: its payload, header, codec id and CRC32C as a kernel stage leaves them."""
    raw = np.frombuffer(chunk.payload, dtype=ml_dtypes.bfloat16).reshape(chunk.shape)  # a block's rows are BF16
    out = codec.encode(raw)
    payload = kv_frames.byte_view(out.payload)
    return replace(chunk, codec_id=kv_frames.codec_id(name), codec_header=out.header, payload=payload,
                   payload_crc=crc32c(payload))
