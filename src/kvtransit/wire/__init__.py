"""Sans-IO framing of every hop (stdlib + crc32c only: no sockets, no asyncio, no clock).

    conn = Connection(our_role=Role.PREFILL, their_role=Role.MIDDLEBOX)
    transport.write(conn.send(events.Hello(role=Role.PREFILL, version=WIRE_VERSION, name="prefill-0")))
    transport.writelines(conn.send_parts(events.KvChunk(...)))   # payload not copied
    conn.receive_data(data)            # b"" is EOF
    while (event := conn.next_event()) is not NEED_DATA: ...

The frame layout, transition table, limits and error codes are documented in docs/WIRE.md.
"""

from kvtransit.wire import events, limits
from kvtransit.wire._connection import Connection
from kvtransit.wire._crc import crc32c, crc32c_combine
from kvtransit.wire._frames import HEADER_SIZE, FrameType, pack_header
from kvtransit.wire._state import ROLE_FRAMES, STATE_TRANSITIONS, State
from kvtransit.wire.errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from kvtransit.wire.events import NEED_DATA, AckStatus, ConnectionClosed, DType, Role
from kvtransit.wire.limits import MAX_CODEC_HEADER, MAX_META, MAX_PAYLOAD, WIRE_VERSION, clip_message, clip_reason

__all__ = ["Connection", "Role", "DType", "AckStatus", "State", "FrameType", "ErrorCode", "NEED_DATA",
           "ConnectionClosed", "ProtocolError", "RemoteProtocolError", "LocalProtocolError", "events", "limits",
           "ROLE_FRAMES", "STATE_TRANSITIONS", "HEADER_SIZE", "MAX_PAYLOAD", "MAX_META", "MAX_CODEC_HEADER",
           "WIRE_VERSION", "crc32c", "crc32c_combine", "clip_message", "clip_reason", "pack_header"]
