"""The chaos suite's rogue frames are built from the wire's own header definition, and are what a peer refuses."""

from __future__ import annotations

import pytest

from kvtransit.harness.studies.chaos import oversized_chunk_header
from kvtransit.wire import Connection, ErrorCode, RemoteProtocolError, Role
from kvtransit.wire.events import Hello
from kvtransit.wire.limits import MAX_PAYLOAD, WIRE_VERSION


def test_the_oversized_chunk_header_is_a_well_formed_header_that_a_peer_refuses_for_its_payload_length():
    sender = Connection(Role.MIDDLEBOX, Role.DECODE)
    receiver = Connection(Role.DECODE, Role.MIDDLEBOX)
    receiver.receive_data(sender.send(Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name="rogue")))
    assert isinstance(receiver.next_event(), Hello)
    receiver.receive_data(oversized_chunk_header())
    # Refused on its header alone (its CRC, magic and version pass): before a byte of the payload is buffered.
    with pytest.raises(RemoteProtocolError, match=f"payload_length {MAX_PAYLOAD + 1} exceeds MAX_PAYLOAD") as caught:
        receiver.next_event()
    assert caught.value.code == ErrorCode.FIELD_OUT_OF_RANGE
