"""A hand-off's layers back from the chunks that carried them, for whoever inverts what arrived (decode's accuracy
sample, the real model's reading of the KV, realmodel/live_worker.py).

A chunk is (layer, codec id, codec header, payload, shape): raw BF16 rows (codec id 0, the identity: the payload is
the rows themselves) or any codec's header and payload (`registry.decode` inverts it from those alone). A layer's
chunks are runs of rows that make up its rows for one token segment (chunked prefill cuts along tokens too,
agents/prefill/handoff_frames.py), the segments in token order, joined along tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
from ml_dtypes import bfloat16

from kvtransit.kernels.header import CODEC_IDS
from kvtransit.kernels.registry import decode as codec_decode

# (layer, codec id, codec header, payload, shape) of one chunk, as decode keeps it (agents/decode/incoming.py).
Chunk = tuple[int, int, bytes, bytes, tuple[int, ...]]
IDENTITY_CODEC_ID = CODEC_IDS["none"]


def decoded_rows(codec_id: int, header: bytes, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """One chunk's rows: the raw BF16 rows as they are, or the codec's decode."""
    if codec_id == IDENTITY_CODEC_ID:
        return np.frombuffer(payload, dtype=bfloat16).reshape(shape)
    return codec_decode(header, payload)


def decoded_layers(chunks: Iterable[Chunk], rows_per_layer: int) -> Iterator[tuple[int, np.ndarray]]:
    """Each layer's rows [rows_per_layer, tokens, head_dim], in layer order of first appearance."""
    layers: dict[int, list[list[np.ndarray]]] = {}
    for layer, codec_id, header, payload, shape in chunks:
        decoded = decoded_rows(codec_id, header, payload, shape)
        segments = layers.setdefault(layer, [])
        if not segments or sum(piece.shape[0] for piece in segments[-1]) == rows_per_layer:
            segments.append([])
        segments[-1].append(decoded)
    for layer, segments in layers.items():
        yield layer, np.concatenate([np.concatenate(pieces, axis=0) for pieces in segments], axis=1)
