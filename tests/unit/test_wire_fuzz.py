"""Fuzz receive_data with random and mutated streams: only RemoteProtocolError, and bounded memory.

Example count: tests/unit/_fuzz.py (a few hundred locally; 10,000 when CI=true, so the random-bytes and
mutated-stream properties each reach 10,000 inputs to the wire parser); KVTRANSIT_FUZZ_EXAMPLES overrides it.
"""

from hypothesis import given
from hypothesis import strategies as st

from kvtransit.wire import NEED_DATA, Connection, ConnectionClosed, RemoteProtocolError, Role

from ._fuzz import fuzz_settings
from ._wire_samples import valid_stream

FUZZ = fuzz_settings()

_, VALID = valid_stream(Role.PREFILL, Role.MIDDLEBOX)
READ = 4096
MAX_PAYLOAD = 1 << 16  # a small limit so the memory bound is tight enough to mean something


def feed(data: bytes, read: int = READ):
    """Feed in reads of ≤ read bytes, draining after each; only RemoteProtocolError may escape."""
    rx = Connection(Role.MIDDLEBOX, Role.PREFILL, max_payload=MAX_PAYLOAD, read_size=read)
    refusal: RemoteProtocolError | None = None
    try:
        for i in range(0, len(data), read):
            rx.receive_data(data[i:i + read])
            while rx.next_event() is not NEED_DATA:
                pass
            assert rx.buffer_capacity <= rx.max_buffer
        rx.receive_data(b"")
        while not isinstance(rx.next_event(), ConnectionClosed):
            pass
    except RemoteProtocolError as e:
        refusal = e
    if refusal is not None:  # a refusal says why, with a code
        assert str(refusal) and refusal.code
    assert rx.buffer_capacity <= rx.max_buffer


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_raise_only_remote_protocol_errors(data):
    feed(data)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete"]), st.integers(0, len(VALID) - 1),
                          st.integers(1, 255)), min_size=1, max_size=4),
       st.integers(1, 512))
def test_mutated_valid_streams_raise_only_remote_protocol_errors(mutations, read):
    data = bytearray(VALID)
    for kind, pos, byte in mutations:
        pos %= max(len(data), 1)
        if kind == "flip":
            data[pos] ^= byte
        elif kind == "insert":
            data[pos:pos] = bytes([byte])
        else:
            del data[pos]
    feed(bytes(data), read)


@FUZZ
@given(st.integers(0, len(VALID)))
def test_truncated_valid_streams_raise_only_remote_protocol_errors(cut):
    feed(VALID[:cut])
