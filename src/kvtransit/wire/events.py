"""The events a Connection turns into frames and back: frozen dataclasses of plain values.

Field ranges are checked by the codec (`_frames.py`) on both sides of the wire, so an out-of-range value
is a LocalProtocolError when we send it and a RemoteProtocolError when the peer does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kvtransit.wire.errors import ErrorCode


class Role(enum.IntEnum):
    """Which process is at each end of a connection (the transition table is keyed by these)."""

    LOADGEN = 1
    PREFILL = 2
    MIDDLEBOX = 3
    DECODE = 4
    KVPOOL = 5  # the shared KV pool (prefix blocks by content hash), reached through the middlebox


class DType(enum.IntEnum):
    """Element type of a KvChunk's tensor (before the codec). Values are wire codes; never reorder."""

    BF16 = 1
    F16 = 2
    F32 = 3
    F64 = 4
    U8 = 5
    I8 = 6
    I32 = 7
    F8_E4M3 = 8
    F8_E5M2 = 9
    C64 = 10  # complex64: spectral coefficients of the band-keep codec

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]


_ITEMSIZE = {DType.BF16: 2, DType.F16: 2, DType.F32: 4, DType.F64: 8, DType.U8: 1, DType.I8: 1, DType.I32: 4,
             DType.F8_E4M3: 1, DType.F8_E5M2: 1, DType.C64: 8}


class AckStatus(enum.IntEnum):
    OK = 1  # KV delivered and admitted: the sender may release it
    FAILED = 2  # KV lost or refused: the sender may release it, the request failed


@dataclass(frozen=True)
class Hello:
    """First frame in each direction of every connection."""

    role: Role
    version: int
    name: str


@dataclass(frozen=True)
class Request:
    """loadgen → prefill: one inference request. sent_ns: shared CLOCK_MONOTONIC ns at send.

    hash_ids: the ids of the prompt's KV blocks, a hash chain (flows/tier/prefix.py), for prefix reuse; () when the
    workload names none. At most MAX_HASH_IDS."""

    request_id: int
    prompt_tokens: int
    output_tokens: int
    sent_ns: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class FirstToken:
    """prefill → loadgen: the request's first token was produced at t_ns."""

    request_id: int
    t_ns: int


@dataclass(frozen=True)
class KvBegin:
    """Opens a request's KV stream; carries what decode needs to admit it before the bytes arrive."""

    request_id: int
    prompt_tokens: int
    output_tokens: int
    n_layers: int
    n_chunks: int  # KvChunk frames that follow, indexed 0 .. n_chunks-1 in order
    raw_bytes: int  # KV size before any codec, summed over all chunks
    codec: str  # codec name (≤ MAX_CODEC_NAME UTF-8 bytes); "none" for raw
    first_token_ns: int


@dataclass(frozen=True)
class KvChunk:
    """One slice of a request's KV (typically one layer or part of one).

    dtype/shape describe the tensor before the codec, so raw_bytes == prod(shape) × dtype.itemsize; with
    codec_id 0 (identity) the payload is that tensor and len(payload) == raw_bytes.

    Received payloads are memoryview slices of the connection's receive buffer (see Connection).
    payload_crc: on receive, the verified CRC32C of the payload. On send, leave None to have it computed,
    or pass the CRC received with this same payload to relay it unchanged without a second CRC pass.
    release_ns: when this slice of KV came to exist (layer-wise streaming, chunked prefill: its layer's or chunk's
    compute ended then); 0, the default, for none of its own: it is ready with its stream (KvBegin.first_token_ns).
    Carried only when non-zero, so a chunk without one is the same frame as before the field existed.
    """

    request_id: int
    layer: int
    chunk: int
    dtype: DType
    shape: tuple[int, ...]
    codec_id: int
    codec_header: bytes
    payload: bytes | bytearray | memoryview
    raw_bytes: int
    payload_crc: int | None = field(default=None, compare=False)
    release_ns: int = 0


@dataclass(frozen=True)
class KvEnd:
    """Closes a KV stream. checksum: CRC32C over all chunk payloads in order; wire_bytes: their total length.
    Connection.kv_end(request_id) builds this from what was actually sent."""

    request_id: int
    n_chunks: int
    checksum: int
    wire_bytes: int


@dataclass(frozen=True)
class TokenEntry:
    request_id: int
    token_index: int  # 0 is the first token (emitted by prefill); decode streams 1 ..
    t_ns: int


@dataclass(frozen=True)
class Tokens:
    """decode → loadgen: tokens produced (usually one decode step's worth, for many requests)."""

    entries: tuple[TokenEntry, ...]


@dataclass(frozen=True)
class Ack:
    """KV receiver → KV sender, per request: the sender may release the KV. t_ns: when the acker finished."""

    request_id: int
    status: AckStatus
    t_ns: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Error:
    """A failure reported to the peer: per request (request_id set) or for the connection (None)."""

    code: ErrorCode
    message: str
    request_id: int | None = None


@dataclass(frozen=True)
class PoolFetch:
    """→ kvpool: send the longest leading run of these blocks you hold. Answered by a PoolHit and, when
    blocks > 0, a KV stream (KvBegin, each block's chunks in order, KvEnd) under the same request id."""

    request_id: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class PoolHit:
    """kvpool →: how many leading blocks of a PoolFetch it holds (and will stream next), block_tokens each."""

    request_id: int
    blocks: int
    block_tokens: int


@dataclass(frozen=True)
class PoolPut:
    """→ kvpool: the KV stream that follows under this request id holds these blocks, in order, each
    n_chunks / len(hash_ids) consecutive chunks. Answered by an Ack once stored (detail: how many were new)."""

    request_id: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Bye:
    """Last frame in its direction: the sender will send nothing more."""

    reason: str = ""


@dataclass(frozen=True)
class ConnectionClosed:
    """Returned by next_event() after EOF at a frame boundary (and on every call after that)."""


class _NeedData:
    """Sentinel returned by next_event() when the buffer holds no complete frame."""

    _instance: _NeedData | None = None

    def __new__(cls) -> _NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()

Event = (Hello | Request | FirstToken | KvBegin | KvChunk | KvEnd | Tokens | Ack | Error | Bye | PoolFetch | PoolHit
         | PoolPut)
KvEvent = KvBegin | KvChunk | KvEnd
# What Connection.next_event() hands out.
Received = Event | ConnectionClosed | _NeedData
