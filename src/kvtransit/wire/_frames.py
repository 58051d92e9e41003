"""The frame format: a fixed 76-byte header, then codec header, meta and payload (docs/WIRE.md).

Pure functions from events to bytes and back. Every check names the field and the value; the caller
passes which error class to raise (LocalProtocolError when encoding ours, RemoteProtocolError when decoding
theirs), so one table of limits serves both directions.

Why one file of ~460 lines: `encode` and `parse_header`/`decode_body` are the two directions of one layout,
and each frame type's meta struct is used by both; kept side by side, a change to a frame's layout is one
edit read against its twin, and tests/unit/test_wire_doc.py holds both to docs/WIRE.md.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Callable
from operator import index
from typing import Any, TypeVar

from kvtransit.wire import events as ev
from kvtransit.wire._crc import crc32c
from kvtransit.wire.errors import ErrorCode, ProtocolError
from kvtransit.wire.limits import (
    MAGIC,
    MAX_CODEC_HEADER,
    MAX_CODEC_NAME,
    MAX_HASH_IDS,
    MAX_MESSAGE,
    MAX_META,
    MAX_NAME,
    MAX_NDIM,
    MAX_REASON,
    MAX_TOKENS_PER_REQUEST,
    WIRE_VERSION,
)


class FrameType(enum.IntEnum):
    HELLO = 1
    REQUEST = 2
    FIRST_TOKEN = 3
    KV_BEGIN = 4
    KV_CHUNK = 5
    KV_END = 6
    TOKENS = 7
    ACK = 8
    ERROR = 9
    BYE = 10
    POOL_FETCH = 11
    POOL_HIT = 12
    POOL_PUT = 13


FLAG_HAS_REQUEST_ID = 0x0001  # Error only: the header's request_id names the failed request

# magic, version, frame_type, flags, request_id, layer, chunk, dtype, ndim, codec_id, shape[5],
# codec_header_length, reserved, meta_length, payload_length, payload_crc, meta_crc, header_crc
HEADER = struct.Struct("!4sBBHQIIBBH5IHHIQIII")
HEADER_SIZE = HEADER.size  # 76
_HEADER_CRC_OFFSET = HEADER_SIZE - 4
_HEADER_BODY = struct.Struct(HEADER.format[:-1])  # everything the header CRC covers

U32 = 2**32 - 1
U64 = 2**64 - 1

EVENT_TYPES = {ev.Hello: FrameType.HELLO, ev.Request: FrameType.REQUEST, ev.FirstToken: FrameType.FIRST_TOKEN,
               ev.KvBegin: FrameType.KV_BEGIN, ev.KvChunk: FrameType.KV_CHUNK, ev.KvEnd: FrameType.KV_END,
               ev.Tokens: FrameType.TOKENS, ev.Ack: FrameType.ACK, ev.Error: FrameType.ERROR, ev.Bye: FrameType.BYE,
               ev.PoolFetch: FrameType.POOL_FETCH, ev.PoolHit: FrameType.POOL_HIT, ev.PoolPut: FrameType.POOL_PUT}

# Which frame types carry a request id in the header (the others must send 0).
REQUEST_SCOPED = frozenset({FrameType.REQUEST, FrameType.FIRST_TOKEN, FrameType.KV_BEGIN, FrameType.KV_CHUNK,
                            FrameType.KV_END, FrameType.ACK, FrameType.POOL_FETCH, FrameType.POOL_HIT,
                            FrameType.POOL_PUT})
ALLOWED_FLAGS = {FrameType.ERROR: FLAG_HAS_REQUEST_ID}

_HELLO = struct.Struct("!HB")  # version, role; then name
_REQUEST = struct.Struct("!IIQ")  # prompt_tokens, output_tokens, sent_ns
_FIRST_TOKEN = struct.Struct("!Q")  # t_ns
_KV_BEGIN = struct.Struct("!IIIIQQ")  # prompt, output, n_layers, n_chunks, raw_bytes, first_token_ns; then codec
_KV_CHUNK = struct.Struct("!Q")  # raw_bytes; then, only when non-zero, _RELEASE
_RELEASE = struct.Struct("!Q")  # KvChunk.release_ns (layer-wise streaming; absent = 0, the frame as it always was)
_KV_END = struct.Struct("!IIQ")  # n_chunks, checksum, wire_bytes
_TOKEN = struct.Struct("!QIQ")  # request_id, token_index, t_ns (one per entry)
_ACK = struct.Struct("!BQ")  # status, t_ns; then detail
_ERROR = struct.Struct("!H")  # code; then message
_HASH_ID = struct.Struct("!Q")  # one block id (Request's tail, PoolFetch, PoolPut)
_POOL_HIT = struct.Struct("!II")  # blocks, block_tokens


class Header:
    """A parsed, validated fixed header."""

    __slots__ = ("frame_type", "flags", "request_id", "layer", "chunk", "dtype", "shape", "codec_id",
                 "codec_header_length", "meta_length", "payload_length", "payload_crc", "meta_crc", "frame_length")
    frame_type: FrameType
    flags: int
    request_id: int
    layer: int
    chunk: int
    dtype: int
    shape: tuple[int, ...]
    codec_id: int
    codec_header_length: int
    meta_length: int
    payload_length: int
    payload_crc: int
    meta_crc: int
    frame_length: int

    def describe(self) -> str:
        """`KvChunk request 7 layer 3 chunk 0`: where an error happened, for messages."""
        name = EVENT_NAMES[self.frame_type]
        if self.frame_type == FrameType.KV_CHUNK:
            return f"{name} request {self.request_id} layer {self.layer} chunk {self.chunk}"
        if self.frame_type in REQUEST_SCOPED:
            return f"{name} request {self.request_id}"
        return name


EVENT_NAMES = {t: cls.__name__ for cls, t in EVENT_TYPES.items()}

# Which error to raise: LocalProtocolError when encoding ours, RemoteProtocolError when decoding theirs.
ErrorClass = type[ProtocolError]
# A bytes-like object the caller owns, read in place.
Buffer = bytes | bytearray | memoryview
_E = TypeVar("_E", bound=enum.Enum)


def _fail(err: ErrorClass, message: str, code: ErrorCode = ErrorCode.FIELD_OUT_OF_RANGE) -> ProtocolError:
    return err(message, code)


def _int_in(err: ErrorClass, name: str, value: Any, lo: int, hi: int) -> int:
    try:
        number = index(value)
    except TypeError:
        raise _fail(err, f"{name} must be an int, got {value!r}") from None
    if not lo <= number <= hi:
        raise _fail(err, f"{name} {number} out of range [{lo}, {hi}]")
    return number


def _text(err: ErrorClass, name: str, value: object, limit: int) -> bytes:
    if not isinstance(value, str):
        raise _fail(err, f"{name} must be a str, got {value!r}")
    data = value.encode("utf-8")
    if len(data) > limit:
        raise _fail(err, f"{name} is {len(data)} UTF-8 bytes, exceeds its limit of {limit}")
    return data


def _enum(err: ErrorClass, name: str, enum_cls: type[_E], value: object) -> _E:
    try:
        return enum_cls(value)
    except ValueError:
        raise _fail(err, f"unknown {name} {value!r} (valid: {', '.join(m.name for m in enum_cls)})") from None


# ---------------------------------------------------------------------------------------------- encode


def encode(event: Any, err: ErrorClass, max_payload: int) -> tuple[bytes, memoryview | None, int, int]:
    """event → (header + codec header + meta, payload view or None, payload_crc, payload_length).

    `event` is Any on purpose: anything may be handed in, and each field is checked here, by its frame type."""
    frame_type = EVENT_TYPES.get(type(event))
    if frame_type is None:
        raise _fail(err, f"cannot send {event!r}: not a wire event", ErrorCode.ILLEGAL_FRAME)
    request_id = layer = chunk = dtype = ndim = codec_id = flags = 0
    shape: tuple[int, ...] = (0, 0, 0, 0, 0)
    codec_header = b""
    payload = None
    payload_crc = payload_length = 0

    if frame_type == FrameType.HELLO:
        meta = (_HELLO.pack(_int_in(err, "Hello.version", event.version, 0, 0xFFFF),
                            _enum(err, "Hello.role", ev.Role, event.role))
                + _text(err, "Hello.name", event.name, MAX_NAME))
    elif frame_type == FrameType.REQUEST:
        meta = _REQUEST.pack(_int_in(err, "Request.prompt_tokens", event.prompt_tokens, 1, MAX_TOKENS_PER_REQUEST),
                             _int_in(err, "Request.output_tokens", event.output_tokens, 1, MAX_TOKENS_PER_REQUEST),
                             _int_in(err, "Request.sent_ns", event.sent_ns, 0, U64)) + _pack_hash_ids(
            err, "Request.hash_ids", event.hash_ids, allow_empty=True)
    elif frame_type in (FrameType.POOL_FETCH, FrameType.POOL_PUT):
        meta = _pack_hash_ids(err, f"{type(event).__name__}.hash_ids", event.hash_ids, allow_empty=False)
    elif frame_type == FrameType.POOL_HIT:
        meta = _POOL_HIT.pack(_int_in(err, "PoolHit.blocks", event.blocks, 0, MAX_HASH_IDS),
                              _int_in(err, "PoolHit.block_tokens", event.block_tokens, 1, MAX_TOKENS_PER_REQUEST))
    elif frame_type == FrameType.FIRST_TOKEN:
        meta = _FIRST_TOKEN.pack(_int_in(err, "FirstToken.t_ns", event.t_ns, 0, U64))
    elif frame_type == FrameType.KV_BEGIN:
        meta = _KV_BEGIN.pack(
            _int_in(err, "KvBegin.prompt_tokens", event.prompt_tokens, 1, MAX_TOKENS_PER_REQUEST),
            _int_in(err, "KvBegin.output_tokens", event.output_tokens, 1, MAX_TOKENS_PER_REQUEST),
            _int_in(err, "KvBegin.n_layers", event.n_layers, 1, U32),
            _int_in(err, "KvBegin.n_chunks", event.n_chunks, 1, U32),
            _int_in(err, "KvBegin.raw_bytes", event.raw_bytes, 0, U64),
            _int_in(err, "KvBegin.first_token_ns", event.first_token_ns, 0, U64),
        ) + _text(err, "KvBegin.codec", event.codec, MAX_CODEC_NAME)
    elif frame_type == FrameType.KV_CHUNK:
        layer = _int_in(err, "KvChunk.layer", event.layer, 0, U32)
        chunk = _int_in(err, "KvChunk.chunk", event.chunk, 0, U32)
        dtype = _enum(err, "KvChunk.dtype", ev.DType, event.dtype)
        dims = tuple(event.shape)
        ndim = len(dims)
        if not 1 <= ndim <= MAX_NDIM:
            raise _fail(err, f"KvChunk.shape {dims} has {ndim} dims, must have 1..{MAX_NDIM}")
        shape = tuple(_int_in(err, f"KvChunk.shape[{i}]", d, 0, U32) for i, d in enumerate(dims))
        shape += (0,) * (MAX_NDIM - ndim)
        codec_id = _int_in(err, "KvChunk.codec_id", event.codec_id, 0, 0xFFFF)
        codec_header = bytes(event.codec_header)
        if len(codec_header) > MAX_CODEC_HEADER:
            raise _fail(err, f"KvChunk.codec_header is {len(codec_header)} bytes, exceeds MAX_CODEC_HEADER "
                             f"{MAX_CODEC_HEADER}")
        raw_bytes = _int_in(err, "KvChunk.raw_bytes", event.raw_bytes, 0, U64)
        payload = event.payload if isinstance(event.payload, memoryview) else memoryview(event.payload)
        if payload.ndim != 1 or payload.format not in ("B", "b", "c"):
            payload = payload.cast("B")  # e.g. a numpy array's buffer: send its bytes (must be contiguous)
        payload_length = payload.nbytes
        _check_chunk_sizes(err, f"KvChunk request {event.request_id} layer {layer} chunk {chunk}",
                           dtype, dims, raw_bytes, codec_id, payload_length, max_payload)
        payload_crc = event.payload_crc if event.payload_crc is not None else crc32c(payload)
        release_ns = _int_in(err, "KvChunk.release_ns", event.release_ns, 0, U64)
        meta = _KV_CHUNK.pack(raw_bytes) + (_RELEASE.pack(release_ns) if release_ns else b"")
    elif frame_type == FrameType.KV_END:
        meta = _KV_END.pack(_int_in(err, "KvEnd.n_chunks", event.n_chunks, 1, U32),
                            _int_in(err, "KvEnd.checksum", event.checksum, 0, U32),
                            _int_in(err, "KvEnd.wire_bytes", event.wire_bytes, 0, U64))
    elif frame_type == FrameType.TOKENS:
        entries = tuple(event.entries)
        if not entries:
            raise _fail(err, "Tokens.entries is empty (send nothing instead)")
        if len(entries) * _TOKEN.size > MAX_META:
            raise _fail(err, f"Tokens has {len(entries)} entries, exceeds {MAX_META // _TOKEN.size} per frame "
                             f"(MAX_META {MAX_META}); split it")
        meta = b"".join(_TOKEN.pack(_int_in(err, "TokenEntry.request_id", e.request_id, 0, U64),
                                    _int_in(err, "TokenEntry.token_index", e.token_index, 0, U32),
                                    _int_in(err, "TokenEntry.t_ns", e.t_ns, 0, U64)) for e in entries)
    elif frame_type == FrameType.ACK:
        meta = _ACK.pack(_enum(err, "Ack.status", ev.AckStatus, event.status),
                         _int_in(err, "Ack.t_ns", event.t_ns, 0, U64)) + _text(err, "Ack.detail", event.detail,
                                                                               MAX_REASON)
    elif frame_type == FrameType.ERROR:
        meta = _ERROR.pack(_enum(err, "Error.code", ErrorCode, event.code)) + _text(
            err, "Error.message", event.message, MAX_MESSAGE)
        if event.request_id is not None:
            flags = FLAG_HAS_REQUEST_ID
            request_id = _int_in(err, "Error.request_id", event.request_id, 0, U64)
    else:  # BYE
        meta = _text(err, "Bye.reason", event.reason, MAX_REASON)

    if frame_type in REQUEST_SCOPED:
        request_id = _int_in(err, f"{type(event).__name__}.request_id", event.request_id, 0, U64)
    header = pack_header(frame_type, flags=flags, request_id=request_id, layer=layer, chunk=chunk, dtype=dtype,
                         shape=shape[:ndim], codec_id=codec_id, codec_header_length=len(codec_header),
                         meta_length=len(meta), payload_length=payload_length, payload_crc=payload_crc,
                         meta_crc=crc32c(codec_header + meta))
    return header + codec_header + meta, payload, payload_crc, payload_length


def pack_header(frame_type: int, *, flags: int = 0, request_id: int = 0, layer: int = 0, chunk: int = 0,
                dtype: int = 0, shape: tuple[int, ...] = (), codec_id: int = 0, codec_header_length: int = 0,
                meta_length: int = 0, payload_length: int = 0, payload_crc: int = 0, meta_crc: int = 0) -> bytes:
    """The fixed header with its own CRC, fields as given and NOT checked against the limits (`encode` checks
    first): also how a fault injector builds a well-formed header that announces what a peer must refuse."""
    body = _HEADER_BODY.pack(MAGIC, WIRE_VERSION, frame_type, flags, request_id, layer, chunk, dtype, len(shape),
                             codec_id, *shape, *(0,) * (MAX_NDIM - len(shape)), codec_header_length, 0, meta_length,
                             payload_length, payload_crc, meta_crc)
    return body + crc32c(body).to_bytes(4, "big")


def _pack_hash_ids(err: ErrorClass, name: str, hash_ids: Any, *, allow_empty: bool) -> bytes:
    ids = tuple(hash_ids)
    if not ids and not allow_empty:
        raise _fail(err, f"{name} is empty (a pool frame names at least one block)")
    if len(ids) > MAX_HASH_IDS:
        raise _fail(err, f"{name} has {len(ids)} ids, exceeds MAX_HASH_IDS {MAX_HASH_IDS}")
    return b"".join(_HASH_ID.pack(_int_in(err, f"{name}[{i}]", h, 0, U64)) for i, h in enumerate(ids))


def _unpack_hash_ids(err: ErrorClass, name: str, data: bytes, where: str, *, allow_empty: bool) -> tuple[int, ...]:
    if len(data) % _HASH_ID.size:
        raise _fail(err, f"{name} on {where}: {len(data)} bytes is not a whole number of 8-byte ids",
                    ErrorCode.MALFORMED_META)
    n = len(data) // _HASH_ID.size
    if n > MAX_HASH_IDS or (n == 0 and not allow_empty):
        raise _fail(err, f"{name} on {where}: {n} ids, must be {0 if allow_empty else 1}..{MAX_HASH_IDS}")
    return tuple(h for (h,) in _HASH_ID.iter_unpack(data))


def _check_chunk_sizes(err: ErrorClass, where: str, dtype: int, dims: tuple[int, ...], raw_bytes: int,
                       codec_id: int, payload_length: int, max_payload: int) -> None:
    expected_raw = math.prod(dims) * ev.DType(dtype).itemsize
    if raw_bytes != expected_raw:
        raise _fail(err, f"raw_bytes {raw_bytes} != prod(shape {tuple(dims)}) × {ev.DType(dtype).name} itemsize "
                         f"= {expected_raw} on {where}")
    if codec_id == 0 and payload_length != raw_bytes:
        raise _fail(err, f"payload_length {payload_length} != raw_bytes {raw_bytes} with codec_id 0 (identity) "
                         f"on {where}")
    if payload_length > max_payload:
        raise _fail(err, f"payload_length {payload_length} exceeds MAX_PAYLOAD {max_payload} on {where}")


# ---------------------------------------------------------------------------------------------- decode


def parse_header(buf: Buffer, offset: int, max_payload: int, err: ErrorClass) -> Header:
    """Validate the fixed header at buf[offset:offset+HEADER_SIZE] (all of it must be there)."""
    (magic, version, frame_type, flags, request_id, layer, chunk, dtype, ndim, codec_id, s0, s1, s2, s3, s4,
     codec_header_length, reserved, meta_length, payload_length, payload_crc, meta_crc,
     header_crc) = HEADER.unpack_from(buf, offset)
    if magic != MAGIC:
        raise _fail(err, f"bad magic {magic!r} (expected {MAGIC!r})", ErrorCode.BAD_MAGIC)
    if version != WIRE_VERSION:
        raise _fail(err, f"unsupported wire version {version} (expected {WIRE_VERSION})", ErrorCode.BAD_VERSION)
    actual = crc32c(bytes(buf[offset:offset + _HEADER_CRC_OFFSET]))
    if actual != header_crc:
        raise _fail(err, f"header crc32c mismatch: header says {header_crc:#010x}, computed {actual:#010x}",
                    ErrorCode.HEADER_CRC_MISMATCH)
    try:
        frame_type = FrameType(frame_type)
    except ValueError:
        raise _fail(err, f"unknown frame type {frame_type}", ErrorCode.UNKNOWN_FRAME_TYPE) from None
    name = EVENT_NAMES[frame_type]
    if flags & ~ALLOWED_FLAGS.get(frame_type, 0):
        raise _fail(err, f"unknown flags {flags:#06x} on {name}")
    if reserved:
        raise _fail(err, f"reserved field {reserved} is not zero on {name}")
    if request_id and frame_type not in REQUEST_SCOPED and not flags & FLAG_HAS_REQUEST_ID:
        raise _fail(err, f"request_id {request_id} on {name}, which carries none")
    shape = (s0, s1, s2, s3, s4)
    if frame_type == FrameType.KV_CHUNK:
        if not 1 <= ndim <= MAX_NDIM:
            raise _fail(err, f"ndim {ndim} out of range [1, {MAX_NDIM}] on KvChunk request {request_id}")
        if any(shape[ndim:]):
            raise _fail(err, f"shape {shape} has non-zero dims beyond ndim {ndim} on KvChunk request {request_id}")
        _enum(err, "dtype", ev.DType, dtype)
        if codec_header_length > MAX_CODEC_HEADER:
            raise _fail(err, f"codec_header_length {codec_header_length} exceeds MAX_CODEC_HEADER "
                             f"{MAX_CODEC_HEADER} on KvChunk request {request_id}")
        if payload_length > max_payload:
            raise _fail(err, f"payload_length {payload_length} exceeds MAX_PAYLOAD {max_payload} on KvChunk "
                             f"request {request_id} layer {layer} chunk {chunk}")
    else:
        for field_name, value in (("layer", layer), ("chunk", chunk), ("dtype", dtype), ("ndim", ndim),
                                  ("codec_id", codec_id), ("codec_header_length", codec_header_length),
                                  ("payload_length", payload_length), ("payload_crc", payload_crc)):
            if value:
                raise _fail(err, f"{field_name} {value} on {name}, which carries none (must be 0)")
        if any(shape):
            raise _fail(err, f"shape {shape} on {name}, which carries none (must be 0)")
    if meta_length > MAX_META:
        raise _fail(err, f"meta_length {meta_length} exceeds MAX_META {MAX_META} on {name}")
    h = Header()
    h.frame_type, h.flags, h.request_id, h.layer, h.chunk = frame_type, flags, request_id, layer, chunk
    h.dtype, h.shape, h.codec_id = dtype, shape[:ndim], codec_id
    h.codec_header_length, h.meta_length, h.payload_length = codec_header_length, meta_length, payload_length
    h.payload_crc, h.meta_crc = payload_crc, meta_crc
    h.frame_length = HEADER_SIZE + codec_header_length + meta_length + payload_length
    return h


def decode_body(h: Header, buf: Buffer, offset: int, err: ErrorClass,
                payload_view: Callable[[int, int], memoryview]) -> ev.Event:
    """The event of a frame whose bytes are all in buf[offset:offset+h.frame_length].

    payload_view(start, stop) returns the payload as a view of the buffer (the caller owns the buffer)."""
    meta_start = offset + HEADER_SIZE
    payload_start = meta_start + h.codec_header_length + h.meta_length
    where = h.describe()
    ext = bytes(buf[meta_start:payload_start])  # codec header + meta: small (≤ 64 KiB + 256 B)
    actual = crc32c(ext)
    if actual != h.meta_crc:
        raise _fail(err, f"meta crc32c mismatch on {where}: header says {h.meta_crc:#010x}, computed "
                         f"{actual:#010x}", ErrorCode.META_CRC_MISMATCH)
    codec_header = ext[:h.codec_header_length]
    meta = ext[h.codec_header_length:]
    t = h.frame_type
    if t == FrameType.HELLO:
        version, role = _unpack_head(_HELLO, meta, where, err)
        return ev.Hello(role=_enum(err, "Hello.role", ev.Role, role), version=version,
                        name=_decode_text(meta[_HELLO.size:], "Hello.name", MAX_NAME, err))
    if t == FrameType.REQUEST:
        prompt, output, sent_ns = _unpack_head(_REQUEST, meta, where, err)
        _int_in(err, "Request.prompt_tokens", prompt, 1, MAX_TOKENS_PER_REQUEST)
        _int_in(err, "Request.output_tokens", output, 1, MAX_TOKENS_PER_REQUEST)
        hash_ids = _unpack_hash_ids(err, "Request.hash_ids", meta[_REQUEST.size:], where, allow_empty=True)
        return ev.Request(request_id=h.request_id, prompt_tokens=prompt, output_tokens=output, sent_ns=sent_ns,
                          hash_ids=hash_ids)
    if t in (FrameType.POOL_FETCH, FrameType.POOL_PUT):
        cls = ev.PoolFetch if t == FrameType.POOL_FETCH else ev.PoolPut
        return cls(request_id=h.request_id,
                   hash_ids=_unpack_hash_ids(err, f"{cls.__name__}.hash_ids", meta, where, allow_empty=False))
    if t == FrameType.POOL_HIT:
        blocks, block_tokens = _unpack_exact(_POOL_HIT, meta, where, err)
        _int_in(err, "PoolHit.blocks", blocks, 0, MAX_HASH_IDS)
        _int_in(err, "PoolHit.block_tokens", block_tokens, 1, MAX_TOKENS_PER_REQUEST)
        return ev.PoolHit(request_id=h.request_id, blocks=blocks, block_tokens=block_tokens)
    if t == FrameType.FIRST_TOKEN:
        (t_ns,) = _unpack_exact(_FIRST_TOKEN, meta, where, err)
        return ev.FirstToken(request_id=h.request_id, t_ns=t_ns)
    if t == FrameType.KV_BEGIN:
        prompt, output, n_layers, n_chunks, raw_bytes, first_ns = _unpack_head(_KV_BEGIN, meta, where, err)
        _int_in(err, "KvBegin.prompt_tokens", prompt, 1, MAX_TOKENS_PER_REQUEST)
        _int_in(err, "KvBegin.output_tokens", output, 1, MAX_TOKENS_PER_REQUEST)
        _int_in(err, "KvBegin.n_layers", n_layers, 1, U32)
        _int_in(err, "KvBegin.n_chunks", n_chunks, 1, U32)
        return ev.KvBegin(request_id=h.request_id, prompt_tokens=prompt, output_tokens=output,
                          n_layers=n_layers, n_chunks=n_chunks, raw_bytes=raw_bytes,
                          codec=_decode_text(meta[_KV_BEGIN.size:], "KvBegin.codec", MAX_CODEC_NAME, err),
                          first_token_ns=first_ns)
    if t == FrameType.KV_CHUNK:
        (raw_bytes,) = _unpack_head(_KV_CHUNK, meta, where, err)
        release_ns = _kv_chunk_release(meta[_KV_CHUNK.size:], where, err)
        dtype = ev.DType(h.dtype)
        _check_chunk_sizes(err, where, dtype, h.shape, raw_bytes, h.codec_id, h.payload_length, U64)
        payload = payload_view(payload_start, payload_start + h.payload_length)
        actual = crc32c(payload)
        if actual != h.payload_crc:
            raise _fail(err, f"crc32c mismatch on {where}: header says {h.payload_crc:#010x}, computed "
                             f"{actual:#010x}", ErrorCode.PAYLOAD_CRC_MISMATCH)
        return ev.KvChunk(request_id=h.request_id, layer=h.layer, chunk=h.chunk, dtype=dtype, shape=h.shape,
                          codec_id=h.codec_id, codec_header=codec_header, payload=payload,
                          raw_bytes=raw_bytes, payload_crc=actual, release_ns=release_ns)
    if t == FrameType.KV_END:
        n_chunks, checksum, wire_bytes = _unpack_exact(_KV_END, meta, where, err)
        _int_in(err, "KvEnd.n_chunks", n_chunks, 1, U32)
        return ev.KvEnd(request_id=h.request_id, n_chunks=n_chunks, checksum=checksum, wire_bytes=wire_bytes)
    if t == FrameType.TOKENS:
        if not meta or len(meta) % _TOKEN.size:
            raise _fail(err, f"Tokens meta_length {len(meta)} is not a positive multiple of {_TOKEN.size}",
                        ErrorCode.MALFORMED_META)
        return ev.Tokens(entries=tuple(ev.TokenEntry(r, i, t_ns) for r, i, t_ns in _TOKEN.iter_unpack(meta)))
    if t == FrameType.ACK:
        status, t_ns = _unpack_head(_ACK, meta, where, err)
        return ev.Ack(request_id=h.request_id, status=_enum(err, "Ack.status", ev.AckStatus, status), t_ns=t_ns,
                      detail=_decode_text(meta[_ACK.size:], "Ack.detail", MAX_REASON, err))
    if t == FrameType.ERROR:
        (code,) = _unpack_head(_ERROR, meta, where, err)
        return ev.Error(code=_enum(err, "Error.code", ErrorCode, code),
                        message=_decode_text(meta[_ERROR.size:], "Error.message", MAX_MESSAGE, err),
                        request_id=h.request_id if h.flags & FLAG_HAS_REQUEST_ID else None)
    return ev.Bye(reason=_decode_text(meta, "Bye.reason", MAX_REASON, err))


def _kv_chunk_release(tail: bytes, where: str, err: ErrorClass) -> int:
    """KvChunk's optional release time after raw_bytes: absent (0), or one non-zero u64 (a zero is sent absent, so
    one frame has one encoding)."""
    if not tail:
        return 0
    if len(tail) != _RELEASE.size:
        raise _fail(err, f"meta_length {_KV_CHUNK.size + len(tail)} on {where}, expected {_KV_CHUNK.size} or "
                         f"{_KV_CHUNK.size + _RELEASE.size}", ErrorCode.MALFORMED_META)
    (release_ns,) = _RELEASE.unpack(tail)
    if release_ns == 0:
        raise _fail(err, f"{where}: a KvChunk release_ns of 0 is sent as no release_ns", ErrorCode.MALFORMED_META)
    return int(release_ns)


def _unpack_exact(s: struct.Struct, meta: bytes, where: str, err: ErrorClass) -> tuple[Any, ...]:
    if len(meta) != s.size:
        raise _fail(err, f"meta_length {len(meta)} on {where}, expected {s.size}", ErrorCode.MALFORMED_META)
    return s.unpack(meta)


def _unpack_head(s: struct.Struct, meta: bytes, where: str, err: ErrorClass) -> tuple[Any, ...]:
    if len(meta) < s.size:
        raise _fail(err, f"meta_length {len(meta)} on {where}, expected at least {s.size}", ErrorCode.MALFORMED_META)
    return s.unpack_from(meta)


def _decode_text(data: bytes, name: str, limit: int, err: ErrorClass) -> str:
    if len(data) > limit:
        raise _fail(err, f"{name} is {len(data)} bytes, exceeds its limit of {limit}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(err, f"{name} is not valid UTF-8 ({e.reason} at byte {e.start})",
                    ErrorCode.MALFORMED_META) from None
