"""Connection: one end of one hop, sans-IO. Bytes in → events out; events in → bytes out.

Receive buffer. One bytearray holds unread bytes in [_start, _end). get_buffer() hands out its free tail so
an asyncio.BufferedProtocol transport reads straight into it; once a frame's header is parsed, get_buffer()
makes room for the whole rest of that frame, so a large payload is received in place by the kernel and
never copied again: the KvChunk event's payload is a memoryview slice of this buffer.

How long a payload view stays valid: until the next receive_data() or get_buffer() call, if you let go of
it by then. If you still hold it at that point (e.g. a transport queued it for writing), the connection
notices (the buffer cannot be resized while exported), leaves the old buffer to you and continues in a
fresh one, so a held view is never overwritten; that costs one buffer allocation, so release views early.

Bounded memory: a header announcing more than the limits is refused before its body is buffered, so if
the caller drains next_event() until NEED_DATA between reads, the buffer never exceeds
max_frame_length + read_size bytes (see max_buffer).
"""

from __future__ import annotations

from kvtransit.wire import events as ev
from kvtransit.wire._frames import EVENT_TYPES, HEADER_SIZE, FrameType, Header, decode_body, encode, parse_header
from kvtransit.wire._state import ROLE_FRAMES, KvStreams, State, check_transition
from kvtransit.wire.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from kvtransit.wire.limits import DEFAULT_READ_SIZE, MAX_CODEC_HEADER, MAX_META, MAX_PAYLOAD, WIRE_VERSION

_KV_EVENTS = (ev.KvBegin, ev.KvChunk, ev.KvEnd)


class Connection:
    def __init__(self, our_role: ev.Role, their_role: ev.Role, *, max_payload: int = MAX_PAYLOAD,
                 read_size: int = DEFAULT_READ_SIZE):
        our_role, their_role = ev.Role(our_role), ev.Role(their_role)
        if (our_role, their_role) not in ROLE_FRAMES:
            pairs = ", ".join(f"{a.name.lower()}→{b.name.lower()}" for a, b in ROLE_FRAMES)
            raise ValueError(f"no connection exists between {our_role.name.lower()} and "
                             f"{their_role.name.lower()} (hops: {pairs})")
        if not 0 <= max_payload <= MAX_PAYLOAD:
            raise ValueError(f"max_payload {max_payload} out of range [0, MAX_PAYLOAD {MAX_PAYLOAD}]")
        self.our_role = our_role
        self.their_role = their_role
        self.our_state = State.AWAIT_HELLO
        self.their_state = State.AWAIT_HELLO
        self.max_payload = max_payload
        self.read_size = read_size
        self.max_frame_length = HEADER_SIZE + MAX_CODEC_HEADER + MAX_META + max_payload
        self._sent_kv = KvStreams()
        self._received_kv = KvStreams()
        self._buf = bytearray(read_size)
        self._start = 0
        self._end = 0
        self._header: Header | None = None  # parsed header of the frame being received
        self._header_next_state: State | None = None  # their state after it (set with _header)
        self._eof = False
        self._failure: RemoteProtocolError | None = None
        self._view_out = False  # a payload view into _buf was handed out and may still be held

    # ------------------------------------------------------------------------------------------ sending

    def send(self, event: ev.Event) -> bytes:
        """The frame for `event`, as one bytes object (copies the payload: use send_parts for KV)."""
        return b"".join(self.send_parts(event))

    def send_parts(self, event: ev.Event) -> list[bytes | memoryview]:
        """[head] or, for KvChunk, [head, payload view]: hand to transport.writelines() without copying the
        payload. head = fixed header + codec header + meta."""
        frame_type = EVENT_TYPES.get(type(event))
        try:
            if frame_type is None:
                raise LocalProtocolError(f"cannot send {event!r}: not a wire event", ErrorCode.ILLEGAL_FRAME)
            if self.our_state == State.ERROR:
                raise LocalProtocolError(f"cannot send {type(event).__name__}: our side already failed",
                                         ErrorCode.ILLEGAL_FRAME)
            if self._failure is not None and frame_type not in (FrameType.ERROR, FrameType.BYE):
                raise LocalProtocolError(f"cannot send {type(event).__name__}: the peer broke the protocol "
                                         f"({self._failure}); only Error and Bye may follow", ErrorCode.ILLEGAL_FRAME)
            next_state = check_transition(self.our_role, self.their_role, self.our_state, frame_type)
            if isinstance(next_state, str):
                raise LocalProtocolError(next_state, ErrorCode.ILLEGAL_FRAME)
            # (The frame type is the event's exact type: isinstance below tells mypy what it is.)
            if isinstance(event, ev.Hello):
                self._check_hello(event, self.our_role, LocalProtocolError)
            if isinstance(event, _KV_EVENTS):
                problem = self._sent_kv.check(event, frame_type)
                if problem:
                    raise LocalProtocolError(problem, ErrorCode.KV_SEQUENCE)
            head, payload, payload_crc, payload_length = encode(event, LocalProtocolError, self.max_payload)
            if isinstance(event, ev.KvEnd):
                problem = self._sent_kv.checksum_error(event)
                if problem:
                    raise LocalProtocolError(problem, ErrorCode.KV_CHECKSUM_MISMATCH)
        except LocalProtocolError:
            self.our_state = State.ERROR
            raise
        if isinstance(event, _KV_EVENTS):
            self._sent_kv.apply(event, frame_type, payload_crc, payload_length)
        elif isinstance(event, ev.Error):
            self._sent_kv.abort(event.request_id)
        self.our_state = next_state
        return [head] if payload is None else [head, payload]

    def kv_end(self, request_id: int) -> ev.KvEnd:
        """The KvEnd that closes what we sent for request_id: counts and checksum from the chunks sent."""
        tally = self._sent_kv.tally(request_id)
        if tally is None:
            raise LocalProtocolError(f"kv_end({request_id}): no KV stream open for that request",
                                     ErrorCode.KV_SEQUENCE)
        n_chunks, checksum, wire_bytes = tally
        return ev.KvEnd(request_id=request_id, n_chunks=n_chunks, checksum=checksum, wire_bytes=wire_bytes)

    # ---------------------------------------------------------------------------------------- receiving

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes from the peer; b"" means EOF."""
        if self._eof:
            raise LocalProtocolError("receive_data after EOF", ErrorCode.ILLEGAL_FRAME)
        n = len(data)
        if n == 0:
            self._eof = True
            return
        self._make_room(n)
        self._buf[self._end:self._end + n] = data
        self._end += n

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Writable view of free buffer space (≥ sizehint, and ≥ the rest of the frame being received)."""
        if self._eof:
            raise LocalProtocolError("get_buffer after EOF", ErrorCode.ILLEGAL_FRAME)
        want = sizehint if sizehint > 0 else self.read_size
        if self._header is not None:
            want = max(want, self._start + self._header.frame_length - self._end)
        self._make_room(want)
        return memoryview(self._buf)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        """nbytes were written at the start of the view get_buffer() returned."""
        if not 0 <= nbytes <= len(self._buf) - self._end:
            raise LocalProtocolError(f"buffer_updated({nbytes}) beyond the {len(self._buf) - self._end} bytes "
                                     f"get_buffer() offered", ErrorCode.ILLEGAL_FRAME)
        self._end += nbytes

    def next_event(self) -> ev.Received:
        """The next event, NEED_DATA, or ConnectionClosed() after EOF at a frame boundary."""
        if self._failure is not None:
            raise RemoteProtocolError(f"connection already failed: {self._failure}", self._failure.code)
        try:
            return self._next_event()
        except RemoteProtocolError as e:
            self._failure = e
            self.their_state = State.ERROR
            raise

    @property
    def max_buffer(self) -> int:
        """The most the receive buffer holds when the caller drains next_event() between reads."""
        return self.max_frame_length + self.read_size

    @property
    def buffer_capacity(self) -> int:
        return len(self._buf)

    # ---------------------------------------------------------------------------------------- internals

    def _next_event(self) -> ev.Received:
        available = self._end - self._start
        h = self._header
        if h is None:
            if available < HEADER_SIZE:
                if not self._eof:
                    return ev.NEED_DATA
                if available:
                    raise RemoteProtocolError(f"peer closed mid-frame: got {available} of {HEADER_SIZE} header "
                                              f"bytes", ErrorCode.TRUNCATED)
                self.their_state = State.CLOSED
                return ev.ConnectionClosed()
            h = parse_header(self._buf, self._start, self.max_payload, RemoteProtocolError)
            # Judge legality from the header alone: an illegal 64 MiB frame is refused before it is buffered.
            next_state = check_transition(self.their_role, self.our_role, self.their_state, h.frame_type)
            if isinstance(next_state, str):
                raise RemoteProtocolError(next_state, ErrorCode.ILLEGAL_FRAME)
            self._header, self._header_next_state = h, next_state
        if available < h.frame_length:
            if self._eof:
                raise RemoteProtocolError(f"peer closed mid-frame: got {available} of {h.frame_length} bytes "
                                          f"of {h.describe()}", ErrorCode.TRUNCATED)
            return ev.NEED_DATA
        event = decode_body(h, self._buf, self._start, RemoteProtocolError, self._payload_view)
        frame_type = h.frame_type
        # decode_body returns the event class of the header's frame type: isinstance tells mypy which.
        if isinstance(event, ev.Hello):
            self._check_hello(event, self.their_role, RemoteProtocolError)
        elif isinstance(event, _KV_EVENTS):
            problem = self._received_kv.check(event, frame_type)
            if problem:
                raise RemoteProtocolError(problem, ErrorCode.KV_SEQUENCE)
            if isinstance(event, ev.KvEnd):
                problem = self._received_kv.checksum_error(event)
                if problem:
                    raise RemoteProtocolError(problem, ErrorCode.KV_CHECKSUM_MISMATCH)
            self._received_kv.apply(event, frame_type, h.payload_crc, h.payload_length)
        elif isinstance(event, ev.Error):
            self._received_kv.abort(event.request_id)
        assert self._header_next_state is not None  # set with self._header
        self.their_state = self._header_next_state
        self._start += h.frame_length
        self._header = None
        if self._start == self._end:
            self._start = self._end = 0  # empty: next bytes go to the front (held views: see _make_room)
        return event

    @staticmethod
    def _check_hello(hello: ev.Hello, expected_role: ev.Role,
                     err: type[LocalProtocolError | RemoteProtocolError]) -> None:
        if hello.role != expected_role:
            raise err(f"Hello from role {ev.Role(hello.role).name.lower()}, expected "
                      f"{expected_role.name.lower()}", ErrorCode.ILLEGAL_FRAME)
        if hello.version != WIRE_VERSION:
            raise err(f"Hello version {hello.version} (expected {WIRE_VERSION})", ErrorCode.BAD_VERSION)

    def _payload_view(self, start: int, stop: int) -> memoryview:
        self._view_out = True
        return memoryview(self._buf)[start:stop]

    def _make_room(self, n: int) -> None:
        """Ensure n free bytes after _end, moving unread bytes to the front or growing the buffer."""
        unread = self._end - self._start
        if self._view_out:
            self._view_out = False
            try:  # a bytearray cannot be resized while a memoryview of it exists: the cheapest probe
                self._buf.append(0)
                self._buf.pop()
            except BufferError:  # the caller still holds a payload view: leave that buffer to it
                self._replace_buffer(max(unread + n, self.read_size))
                return
        if self._end + n <= len(self._buf):
            return
        if unread + n <= len(self._buf):
            if unread:
                with memoryview(self._buf) as view:
                    view[:unread] = view[self._start:self._end]  # memmove; unread is < one frame
            self._start, self._end = 0, unread
            return
        self._replace_buffer(max(unread + n, min(2 * len(self._buf), self.max_buffer)))

    def _replace_buffer(self, capacity: int) -> None:
        unread = self._end - self._start
        fresh = bytearray(capacity)
        with memoryview(self._buf) as old:
            fresh[:unread] = old[self._start:self._end]
        self._buf = fresh
        self._start, self._end = 0, unread
