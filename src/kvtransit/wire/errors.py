"""Whose fault it is: the peer's (RemoteProtocolError) or ours (LocalProtocolError), as in h11."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """The code carried by an Error frame. 1-99: the peer broke the protocol; 100+: the application failed."""

    BAD_MAGIC = 1
    BAD_VERSION = 2
    HEADER_CRC_MISMATCH = 3
    META_CRC_MISMATCH = 4
    PAYLOAD_CRC_MISMATCH = 5
    UNKNOWN_FRAME_TYPE = 6
    FIELD_OUT_OF_RANGE = 7  # a length over its limit, a reserved field not zero, an unknown enum value
    MALFORMED_META = 8  # meta of the wrong size or not valid UTF-8
    ILLEGAL_FRAME = 9  # the transition table forbids this frame here (role, state)
    KV_SEQUENCE = 10  # per-request ordering: unknown request, chunk out of order, duplicate KvBegin
    KV_CHECKSUM_MISMATCH = 11  # KvEnd disagrees with the chunks actually received
    TRUNCATED = 12  # EOF in the middle of a frame

    REQUEST_FAILED = 100  # this request could not be served (the connection carries on)
    OVERLOADED = 101  # refused for capacity (KV does not fit, queue full)
    INTERNAL = 102  # a bug or an unexpected failure on the sender's side
    SHUTTING_DOWN = 103


class ProtocolError(Exception):
    """Base of both error kinds. `code` is what to put in an Error frame to tell the peer."""

    def __init__(self, message: str, code: ErrorCode):
        super().__init__(message)
        self.code = code


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids. The connection's their_state is ERROR afterwards."""


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol forbids (a bug in the caller). our_state is ERROR afterwards."""
