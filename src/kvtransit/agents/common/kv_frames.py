"""How one request's KV becomes wire frames, shared by every sender (prefill, and the middlebox's relay).

A layer's KV is [2 (K, V), kv_heads, tokens, head_dim], C-contiguous, so it is also [2·kv_heads, tokens,
head_dim]: rows of whole token sequences. A chunk is a run of consecutive rows, as many as fit in
`MAX_CHUNK_BYTES`; the token axis is never cut, so a codec working along tokens (band-keep) sees every
token of every row it gets. A layer that fits is one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The identity's codec id is defined with the chunks' inverse (kernels/chunk_rows.py); senders read it here.
from kvtransit.kernels.chunk_rows import IDENTITY_CODEC_ID as IDENTITY_CODEC_ID
from kvtransit.kernels.header import CODEC_IDS
from kvtransit.wire.events import DType, KvChunk

# kvtransit's chunk bound: a layer per frame, or per ≤ 8 MiB piece of a layer (well under the wire's 64 MiB
# MAX_PAYLOAD, so a frame never holds a receive buffer hostage for long).
MAX_CHUNK_BYTES = 8 * 1024 * 1024


def codec_id(name: str) -> int:
    """The KvChunk codec_id of a codec: the kernels' header id (0 = none, the identity)."""
    return CODEC_IDS[name]


@dataclass(frozen=True)
class RowSlice:
    layer: int
    start: int
    stop: int


def row_slices(layers: int, rows_per_layer: int, row_bytes: int,
               max_chunk_bytes: int = MAX_CHUNK_BYTES) -> list[RowSlice]:
    """The chunks of a request, in order: per layer, runs of rows of at most `max_chunk_bytes` (≥ 1 row)."""
    per_chunk = max(1, max_chunk_bytes // max(1, row_bytes))
    return [RowSlice(layer, start, min(start + per_chunk, rows_per_layer))
            for layer in range(layers) for start in range(0, rows_per_layer, per_chunk)]


def as_rows(layer_kv: np.ndarray) -> np.ndarray:
    """[2, heads, tokens, hd] → [2·heads, tokens, hd] (a view)."""
    two, heads, tokens, hd = layer_kv.shape
    return layer_kv.reshape(two * heads, tokens, hd)


def byte_view(array: np.ndarray) -> memoryview:
    """The array's bytes, without a copy (the wire writes memoryviews as they are)."""
    # `.data` is memoryview(array) (numpy's stubs give ndarray no `__buffer__` before Python 3.12).
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def raw_chunk(request_id: int, index: int, piece: RowSlice, rows: np.ndarray) -> KvChunk:
    block = rows[piece.start:piece.stop]
    return KvChunk(request_id=request_id, layer=piece.layer, chunk=index, dtype=DType.BF16, shape=tuple(block.shape),
                   codec_id=IDENTITY_CODEC_ID, codec_header=b"", payload=byte_view(block), raw_bytes=block.nbytes)


def encoded_chunk(request_id: int, index: int, piece: RowSlice, rows: np.ndarray, codec, name: str) -> KvChunk:
    block = rows[piece.start:piece.stop]
    encoded = codec.encode(block)
    return KvChunk(request_id=request_id, layer=piece.layer, chunk=index, dtype=DType.BF16, shape=tuple(block.shape),
                   codec_id=codec_id(name), codec_header=encoded.header, payload=byte_view(encoded.payload),
                   raw_bytes=block.nbytes)


def codec_for(scenario, tokens: int | None = None):
    """The kernels' codec the scenario names, with its parameters (None for "none"; kernels/registry.py:
    `scenario_codec`, which the twin sizes the wire by too). A prompt shorter than the sink count keeps every token
    exact (sinks capped at the prompt length)."""
    from kvtransit.kernels.registry import scenario_codec

    return scenario_codec(scenario, tokens)


def transit_codec(codec: str, *, keep: float, block: int, sinks: int, variant: str, precision_bits: int | None):
    """The module's codec object for a kernel's settings (None for "none"); a warmed pool stores what it makes. `block`
    means a transform's tokens (freq-keep-k) or a scale's values (fp8); fp4-block's is fixed by the format and the KIVI
    codecs' is their group, so they are given none."""
    from kvtransit.kernels.registry import get_codec

    if codec == "none":
        return None
    return get_codec(codec, keep=keep, block=block if codec in ("freq-keep-k", "fp8") else None, sinks=sinks,
                     variant=variant, precision_bits=precision_bits)
