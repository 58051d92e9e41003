"""A hand-off as decode reassembles it: its KvBegin, each chunk's arrival, and (for the accuracy sample) the
chunks themselves, copied out of the receive buffer. Plain records; `agent.py` fills them from the link."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtransit.wire.events import KvBegin

SampledChunk = tuple[int, int, bytes, bytes, tuple[int, ...]]
"""A sampled request's chunk, copied out of the receive buffer: (layer, codec_id, codec header, payload, shape)."""


@dataclass(frozen=True)
class Arrived:
    """When one chunk was here, its bytes, and when its KV was released at the prefill (0: with its stream)."""

    at_ns: int
    wire_bytes: int
    raw_bytes: int
    release_ns: int


@dataclass
class Incoming:
    """One hand-off between its KvBegin and its KvEnd (or its abort)."""

    begin: KvBegin
    began_ns: int
    wire_bytes: int = 0
    sampled: bool = False
    duplicate: bool = False  # a retry of a request already taken: its bytes are drained, never used
    chunks: list[SampledChunk] = field(default_factory=list)  # kept only when sampled
    real: bool = False  # it carries the real model's KV (`--kv-sample real`): the real model reads it
    arrived: list[Arrived] = field(default_factory=list)  # every chunk's arrival: the hand-off's split

    @property
    def first_token_ns(self) -> int:
        """The first token's stamp: the KvBegin's, else (chunked prefill) the last chunk's release; 0 unknown."""
        return self.begin.first_token_ns or max((a.release_ns for a in self.arrived), default=0)

    @property
    def streamed(self) -> bool:
        return any(a.release_ns for a in self.arrived)
