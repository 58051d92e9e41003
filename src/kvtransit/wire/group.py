"""Framing of the group flows' messages: a TP group's all-reduce (ring or switch), ring attention's KV blocks and
query-aware selection's legs. Sans-IO, its own header.

Not the KV hop's frames (wire/_frames.py) and not its state table (wire/_state.py): a collective hop carries
partial sums between ranks (ring) or between ranks and a switch that sums them, so its header names the
group, step, layer, sending rank and chunk instead of a request.

Header, 44 bytes, network byte order:

    magic "KVCO" (4) | version u8 | kind u8 | flags u16 (0) | group u32 | step u32 | layer u32 | rank u16 |
    chunk u16 | due_ns u64 | payload_length u32 | payload_crc u32 (CRC32C) | header_crc u32 (CRC32C of the 40 before)

`due_ns` is when the frame is due at its receiver on the modelled link (the sender's shaper: link latency +
bytes / rate, on the host's monotonic clock, which every process on one host shares); the receiver holds the
frame until then. Kinds: JOIN (a rank joins its group: `chunk` = the group's size), PART (a rank's part or a
ring's partial sum), SUM (the switch's sum, back to a rank), ABORT (the payload is the UTF-8 reason: the
collective failed for everyone), BYE. A query-aware selection's step (flows/selection) adds QUERY (the decode
step's query, to the module that scores), SUMMARIES (the pages' key summaries, from the pool), SCORES (one per page
and kv head, to the host that ranks), FETCH (the pages wanted, int32 ids) and PAGES (their K and V, from the pool);
`step` is the decode step, `rank` the sender's role. Weight streaming's (flows/weights) adds LOAD (an instance
asks for the weights or an adapter) and BLOB (their bytes, as the link carries them). A decode TP group's leader
(agents/tp_group) adds, on its control connection to each follower rank: GO (the payload is UTF-8 JSON saying where
the rank's ring neighbour or the switch is), STEP (a step's order: `step`, `due_ns` when its compute ends and the
all-reduce starts, the payload the all-reduce's BF16 value count as a u32) and, back, DONE (the rank's sum of that
step was exact).

`encode(frame)` gives the bytes (header, payload: two parts, for a writelines without a copy);
`FrameReader.feed(data)` takes bytes in and returns the whole frames they completed. A frame that breaks the
format raises `CollectiveFrameError` naming the field and the value.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from kvtransit.wire._crc import crc32c

MAGIC = b"KVCO"
VERSION = 1
HEADER = struct.Struct("!4sBBHIIIHHQIII")
HEADER_SIZE = HEADER.size  # 44
_HEADER_BODY = struct.Struct(HEADER.format[:-1])  # what the header CRC covers
# The largest payload: a per-step all-reduce of a prefill's activations at scale is tens of MB; 1 GiB bounds
# what a reader buffers for one frame.
MAX_PAYLOAD = 1 << 30
# An ABORT's reason is clipped to this many bytes (wire's MAX_REASON is 1 KiB, for the same kind of text).
MAX_REASON = 1024
U16 = 2**16 - 1
U32 = 2**32 - 1
U64 = 2**64 - 1


class Kind(enum.IntEnum):
    JOIN = 1
    PART = 2
    SUM = 3
    ABORT = 4
    BYE = 5
    QUERY = 6
    SUMMARIES = 7
    SCORES = 8
    FETCH = 9
    PAGES = 10
    LOAD = 11
    BLOB = 12
    GO = 13
    STEP = 14
    DONE = 15


class CollectiveFrameError(ValueError):
    """Bytes that are not a collective frame; the message names the field and the value."""


@dataclass(frozen=True)
class Frame:
    kind: Kind
    group: int
    step: int = 0
    layer: int = 0
    rank: int = 0
    chunk: int = 0
    due_ns: int = 0
    payload: bytes | bytearray | memoryview = b""

    @property
    def reason(self) -> str:
        """An ABORT's reason."""
        return bytes(self.payload).decode("utf-8", errors="replace")


def abort(group: int, reason: str, *, step: int = 0, layer: int = 0, rank: int = 0) -> Frame:
    """An ABORT frame carrying `reason`, clipped to MAX_REASON bytes on a character boundary."""
    data = reason.encode("utf-8")[:MAX_REASON].decode("utf-8", errors="ignore").encode("utf-8")
    return Frame(Kind.ABORT, group, step, layer, rank, 0, 0, data)


def _check(name: str, value: int, top: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise CollectiveFrameError(f"collective frame: {name} must be an integer in 0..{top}, got {value!r}")


def encode(frame: Frame) -> tuple[bytes, bytes | bytearray | memoryview]:
    """(header, payload) of `frame`."""
    if not isinstance(frame.kind, Kind):
        raise CollectiveFrameError(f"collective frame: unknown kind {frame.kind!r}")
    for name, top in (("group", U32), ("step", U32), ("layer", U32), ("rank", U16), ("chunk", U16),
                      ("due_ns", U64)):
        _check(name, getattr(frame, name), top)
    length = memoryview(frame.payload).nbytes
    if length > MAX_PAYLOAD:
        raise CollectiveFrameError(f"collective frame: payload of {length} bytes is over {MAX_PAYLOAD}")
    body = _HEADER_BODY.pack(MAGIC, VERSION, int(frame.kind), 0, frame.group, frame.step, frame.layer, frame.rank,
                             frame.chunk, frame.due_ns, length, crc32c(frame.payload))
    return body + struct.pack("!I", crc32c(body)), frame.payload


def encode_bytes(frame: Frame) -> bytes:
    header, payload = encode(frame)
    return header + bytes(payload)


class FrameReader:
    """Bytes in, whole frames out. After an error the reader is spent (the stream cannot be resynchronised)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._header: tuple[int, ...] | None = None
        self._failed: CollectiveFrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a frame (non-zero at EOF: the peer stopped mid-frame)."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if self._failed is not None:
            raise self._failed
        self._buffer += data
        frames: list[Frame] = []
        try:
            while True:
                frame = self._next()
                if frame is None:
                    return frames
                frames.append(frame)
        except CollectiveFrameError as exc:
            self._failed = exc
            raise

    def _parse_header(self) -> tuple[int, ...]:
        fields = HEADER.unpack_from(self._buffer)
        magic, version, kind, flags = fields[0], fields[1], fields[2], fields[3]
        if magic != MAGIC:
            raise CollectiveFrameError(f"collective frame: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
        if crc32c(memoryview(self._buffer)[:_HEADER_BODY.size]) != fields[-1]:
            raise CollectiveFrameError("collective frame: header CRC32C mismatch")
        if version != VERSION:
            raise CollectiveFrameError(f"collective frame: version {version}, this end speaks {VERSION}")
        if kind not in Kind._value2member_map_:
            raise CollectiveFrameError(f"collective frame: unknown kind {kind}")
        if flags:
            raise CollectiveFrameError(f"collective frame: flags must be 0, got {flags:#x}")
        if fields[10] > MAX_PAYLOAD:
            raise CollectiveFrameError(f"collective frame: payload_length {fields[10]} is over {MAX_PAYLOAD}")
        return tuple(fields)

    def _next(self) -> Frame | None:
        if self._header is None:
            if len(self._buffer) < HEADER_SIZE:
                return None
            self._header = self._parse_header()
        fields = self._header
        length, payload_crc = fields[10], fields[11]
        if len(self._buffer) < HEADER_SIZE + length:
            return None
        payload = bytes(self._buffer[HEADER_SIZE:HEADER_SIZE + length])
        del self._buffer[:HEADER_SIZE + length]
        self._header = None
        if crc32c(payload) != payload_crc:
            raise CollectiveFrameError(
                f"collective frame: payload CRC32C mismatch (kind {Kind(fields[2]).name}, group {fields[4]}, "
                f"step {fields[5]}, layer {fields[6]}, rank {fields[7]})")
        return Frame(Kind(fields[2]), fields[4], fields[5], fields[6], fields[7], fields[8], fields[9], payload)
