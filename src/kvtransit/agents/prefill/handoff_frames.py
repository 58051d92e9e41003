"""One hand-off's KV frames, made when the link sends them, and made again, byte for byte, if it sends again.

A request's KV is a pure function of (seed, request id, tokens) (kernels/synthetic_kv.py), so the prefill
holds the recipe, not the bytes. Made at its step instead, every request waiting for the link kept its whole
KV alive: under a backlog the prefill held ~60 requests (1.1 GB at scale 1/16 on eth-25g, 14 req/s), every
request was cut into fresh pages (6.8 ms of page faults each vs 1.2 ms into reused memory, measured here),
and a step's batch was made in one burst on the event loop that also holds the step timers (py-spy: 39 % of
the prefill's samples). Made per layer as the sender reaches it, the memory is one layer plus what the socket
holds, and it is reused. A layer is made on a worker thread, CRC and all: numpy's copy releases the GIL
(and so does the CRC, crc32c), so the loop's step timers do not wait behind it.

On an idle link the sender reaches a hand-off as soon as its step stages it, so its bytes still go out
while the step's timer runs (the middlebox holds them until the first token): the overlap of host work and
modelled GPU time that agent.py describes is kept.

With chunked prefill the KV is cut along tokens too, into `segments` (model/serving/layerwise.py:
`kv_segments`): each segment's layers are the frames of one prefill chunk, in order, segment by segment, and each
frame says when its KV came to exist (`KvChunk.release_ns`) once the chunk's step is planned. Without chunking there
is one segment, the whole prompt.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

from kvtransit.agents.common import kv_frames
from kvtransit.model.kv_scale import KvLayout
from kvtransit.wire import crc32c
from kvtransit.wire.events import KvChunk


class KvSource(Protocol):
    """Where a request's KV comes from: synthetic templates (kernels/synthetic_kv.py) or the real model's own
    (real_kv.py, `--kv-sample real`)."""

    def layer(self, request_id: int, layer: int, tokens: int) -> np.ndarray:
        """[2, kv_heads, tokens, head_dim] BF16."""
        ...


@dataclass(frozen=True)
class HandoffFrames:
    """The recipe for one request's KvChunks: its KV, cut into the wire's row slices, raw or GPU-encoded."""

    request_id: int
    tokens: int
    layout: KvLayout
    kv: KvSource
    codec: object | None  # the GPU codec (compress_at="gpu"), or None: raw BF16 rows
    codec_name: str
    # Where each token segment ends (chunked prefill), the last at `tokens`; () for one segment, the whole prompt.
    stops: tuple[int, ...] = ()

    @property
    def segments(self) -> tuple[tuple[int, int], ...]:
        """(first token, end) of each segment, in order."""
        stops = self.stops or (self.tokens,)
        return tuple(zip((0, *stops[:-1]), stops, strict=True))

    @property
    def n_segments(self) -> int:
        return len(self.segments)

    def pieces(self, segment: int = 0) -> list[kv_frames.RowSlice]:
        layout = self.layout
        start, stop = self.segments[segment]
        row_bytes = (stop - start) * layout.head_dim * layout.bytes_per_value
        return kv_frames.row_slices(layout.layers, 2 * layout.kv_heads, row_bytes)

    @cached_property
    def _first_index(self) -> tuple[int, ...]:
        """The chunk index each segment's first frame carries (indices run on across segments)."""
        firsts, total = [], 0
        for segment in range(self.n_segments):
            firsts.append(total)
            total += len(self.pieces(segment))
        return (*firsts, total)

    @property
    def n_chunks(self) -> int:
        return self._first_index[-1]

    def layer_chunks(self, layer: int, segment: int = 0, release_ns: int = 0) -> list[KvChunk]:
        """Layer `layer`'s chunks of segment `segment` in wire order, each with its payload CRC computed here (a
        worker thread's work: the event loop only writes them), stamped with `release_ns` (0: none)."""
        start, stop = self.segments[segment]
        rows = kv_frames.as_rows(self.kv.layer(self.request_id, layer, self.tokens))
        if (start, stop) != (0, self.tokens):
            rows = rows[:, start:stop]
        codec = self.codec
        chunks = []
        for offset, piece in enumerate(self.pieces(segment)):
            if piece.layer != layer:
                continue
            index = self._first_index[segment] + offset
            if codec is None:
                chunk = kv_frames.raw_chunk(self.request_id, index, piece, rows)
            else:
                chunk = kv_frames.encoded_chunk(self.request_id, index, piece, rows, codec, self.codec_name)
            chunks.append(dataclasses.replace(chunk, payload_crc=crc32c(chunk.payload), release_ns=release_ns))
        return chunks

    @property
    def n_layers(self) -> int:
        return self.layout.layers
