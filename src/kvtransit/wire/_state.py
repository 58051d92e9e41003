"""The protocol as data (h11's _state.py is the model): who may send which frame, in which state, and the
per-request order of a KV stream. Connection consults these tables; nothing else decides legality.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvtransit.wire._crc import crc32c_combine
from kvtransit.wire._frames import EVENT_NAMES, FrameType
from kvtransit.wire.events import KvBegin, KvChunk, KvEnd, KvEvent, Role
from kvtransit.wire.limits import MAX_OPEN_KV_STREAMS

F = FrameType
_KV = {F.KV_BEGIN, F.KV_CHUNK, F.KV_END}
_POOL_ASK = {F.POOL_FETCH, F.POOL_PUT}  # a pool client's requests (a put's KV stream follows it)

# (sender, receiver) → frame types the sender may send on that hop. A pair not listed has no connection.
ROLE_FRAMES: dict[tuple[Role, Role], frozenset[FrameType]] = {
    # The client's Error naming a request withdraws it (its own client went away): on both of its hops.
    (Role.LOADGEN, Role.PREFILL): frozenset({F.HELLO, F.REQUEST, F.ERROR, F.BYE}),
    (Role.PREFILL, Role.LOADGEN): frozenset({F.HELLO, F.FIRST_TOKEN, F.ERROR, F.BYE}),
    # The same hop carries the prefill's pool traffic (on its own connection to the middlebox's pool port):
    # fetches and write-backs out, PoolHit and the fetched blocks' KV stream back.
    (Role.PREFILL, Role.MIDDLEBOX): frozenset({F.HELLO, *_KV, *_POOL_ASK, F.ERROR, F.BYE}),
    (Role.MIDDLEBOX, Role.PREFILL): frozenset({F.HELLO, F.ACK, F.POOL_HIT, *_KV, F.ERROR, F.BYE}),
    # The KV pool sits behind the middlebox: what reaches it crossed the module and the shaped link.
    (Role.MIDDLEBOX, Role.KVPOOL): frozenset({F.HELLO, *_POOL_ASK, *_KV, F.ERROR, F.BYE}),
    (Role.KVPOOL, Role.MIDDLEBOX): frozenset({F.HELLO, F.POOL_HIT, *_KV, F.ACK, F.ERROR, F.BYE}),
    (Role.MIDDLEBOX, Role.DECODE): frozenset({F.HELLO, *_KV, F.ERROR, F.BYE}),
    (Role.DECODE, Role.MIDDLEBOX): frozenset({F.HELLO, F.ACK, F.ERROR, F.BYE}),
    # Direct hand-off without a module (the baseline): prefill speaks to decode as it would to a middlebox.
    (Role.PREFILL, Role.DECODE): frozenset({F.HELLO, *_KV, F.ERROR, F.BYE}),
    (Role.DECODE, Role.PREFILL): frozenset({F.HELLO, F.ACK, F.ERROR, F.BYE}),
    # The loadgen connects to decode to receive tokens (Hello, at the end Bye), and to withdraw a request (Error).
    (Role.LOADGEN, Role.DECODE): frozenset({F.HELLO, F.ERROR, F.BYE}),
    (Role.DECODE, Role.LOADGEN): frozenset({F.HELLO, F.TOKENS, F.ERROR, F.BYE}),
}


class State(enum.Enum):
    """The state of one direction of a connection (our sending side, or theirs)."""

    AWAIT_HELLO = "AWAIT_HELLO"  # nothing sent yet: Hello must come first (or an Error / Bye refusing the peer)
    OPEN = "OPEN"
    CLOSED = "CLOSED"  # Bye sent (or, for their side, EOF): nothing more may follow
    ERROR = "ERROR"  # a protocol error happened on this side: the connection is unusable


# state → {frame type: next state}. A frame type missing from its state's row is illegal there.
STATE_TRANSITIONS: dict[State, dict[FrameType, State]] = {
    State.AWAIT_HELLO: {F.HELLO: State.OPEN, F.ERROR: State.AWAIT_HELLO, F.BYE: State.CLOSED},
    State.OPEN: {**{t: State.OPEN for t in FrameType if t != F.HELLO}, F.BYE: State.CLOSED},
    State.CLOSED: {},
    State.ERROR: {},
}


def check_transition(sender: Role, receiver: Role, state: State, frame_type: FrameType) -> State | str:
    """The next state, or the reason the frame is illegal (a one-line message)."""
    allowed = ROLE_FRAMES.get((sender, receiver))
    name = EVENT_NAMES[frame_type]
    if allowed is None:
        return f"no connection exists from {sender.name.lower()} to {receiver.name.lower()}"
    if frame_type not in allowed:
        return f"{sender.name.lower()} may not send {name} to {receiver.name.lower()}"
    next_state = STATE_TRANSITIONS[state].get(frame_type)
    if next_state is None:
        if state == State.AWAIT_HELLO:
            return f"{name} before Hello (Hello must come first)"
        if state == State.CLOSED:
            return f"{name} after Bye"
        if state == State.ERROR:
            return f"{name} after a protocol error on this side"
        return f"{name} in state {state.value}"
    return next_state


# Per-request order of a KV stream: (request state, frame type) → next request state.
# None is "no stream open for this request id".
class KvPhase(enum.Enum):
    STREAMING = "STREAMING"


KV_TRANSITIONS: dict[tuple[KvPhase | None, FrameType], KvPhase | None] = {
    (None, F.KV_BEGIN): KvPhase.STREAMING,
    (KvPhase.STREAMING, F.KV_CHUNK): KvPhase.STREAMING,
    (KvPhase.STREAMING, F.KV_END): None,
}


@dataclass
class _KvStream:
    n_layers: int
    n_chunks: int
    next_chunk: int = 0
    checksum: int = 0  # CRC32C over the payloads so far, in order
    wire_bytes: int = 0


class KvStreams:
    """The KV streams open in one direction, checked against KV_TRANSITIONS and the counts in KvBegin.

    Each check returns an error message (str) or None, so the caller picks whose fault it is.
    """

    def __init__(self) -> None:
        self._open: dict[int, _KvStream] = {}

    def __len__(self) -> int:
        return len(self._open)

    def tally(self, request_id: int) -> tuple[int, int, int] | None:
        """(chunks, checksum, wire_bytes) so far of an open stream."""
        s = self._open.get(request_id)
        return None if s is None else (s.next_chunk, s.checksum, s.wire_bytes)

    def _phase_error(self, request_id: int, frame_type: FrameType) -> str | None:
        phase = KvPhase.STREAMING if request_id in self._open else None
        if (phase, frame_type) in KV_TRANSITIONS:
            return None
        name = EVENT_NAMES[frame_type]
        if phase is None:
            return f"{name} for request {request_id}, which has no open KV stream (KvBegin must come first)"
        return f"{name} for request {request_id}, whose KV stream is already open"

    def check(self, event: KvEvent, frame_type: FrameType) -> str | None:
        """Is this KV event legal now? (Does not change anything.)"""
        problem = self._phase_error(event.request_id, frame_type)
        if problem:
            return problem
        if isinstance(event, KvBegin):
            if len(self._open) >= MAX_OPEN_KV_STREAMS:
                return (f"KvBegin for request {event.request_id}: {len(self._open)} KV streams already open "
                        f"(MAX_OPEN_KV_STREAMS {MAX_OPEN_KV_STREAMS})")
            return None
        s = self._open[event.request_id]
        if isinstance(event, KvChunk):
            if event.chunk != s.next_chunk:
                return (f"KvChunk request {event.request_id} chunk {event.chunk} out of order (expected chunk "
                        f"{s.next_chunk})")
            if event.chunk >= s.n_chunks:
                return f"KvChunk request {event.request_id} chunk {event.chunk} beyond n_chunks {s.n_chunks}"
            if event.layer >= s.n_layers:
                return f"KvChunk request {event.request_id} layer {event.layer} beyond n_layers {s.n_layers}"
            return None
        if event.n_chunks != s.next_chunk or s.next_chunk != s.n_chunks:
            return (f"KvEnd request {event.request_id} says n_chunks {event.n_chunks}, but {s.next_chunk} of "
                    f"{s.n_chunks} chunks were sent")
        return None

    def checksum_error(self, event: KvEnd) -> str | None:
        s = self._open[event.request_id]
        if event.checksum != s.checksum or event.wire_bytes != s.wire_bytes:
            return (f"KvEnd request {event.request_id} says checksum {event.checksum:#010x} over "
                    f"{event.wire_bytes} bytes, the chunks gave {s.checksum:#010x} over {s.wire_bytes} bytes")
        return None

    def apply(self, event: KvEvent, frame_type: FrameType, payload_crc: int = 0, payload_length: int = 0) -> None:
        """Record a KV event that check() accepted."""
        if isinstance(event, KvBegin):
            self._open[event.request_id] = _KvStream(event.n_layers, event.n_chunks)
        elif isinstance(event, KvChunk):
            s = self._open[event.request_id]
            s.next_chunk += 1
            s.checksum = crc32c_combine(s.checksum, payload_crc, payload_length)
            s.wire_bytes += payload_length
        else:
            del self._open[event.request_id]

    def abort(self, request_id: int | None) -> None:
        """An Error naming a request ends its KV stream, if one is open: the sender gave up on it (its source
        died, its kernel refused the bytes), and the receiver drops what it had. Other streams carry on."""
        if request_id is not None:
            self._open.pop(request_id, None)


