"""The middlebox's fault stages (agents/middlebox/faults/), each on a real wire connection in memory."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvtransit.agents.middlebox.faults import MAX_FAULTS, FaultChain, FaultedEndpoint, make_fault
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.transport import memory_pair
from kvtransit.wire import ErrorCode, RemoteProtocolError, Role
from kvtransit.wire.events import Hello, KvChunk

from ._wire_samples import kv_stream


async def faulted_pair(*faults: tuple[str, dict]):
    chain = FaultChain()
    for name, body in faults:
        chain.put(make_fault(name, body))
    sender, receiver = memory_pair(Role.MIDDLEBOX, Role.DECODE)
    return chain, FaultedEndpoint(sender, chain), receiver


async def send_stream(endpoint) -> list:
    sent = [Hello(Role.MIDDLEBOX, 1, "middlebox-0"), *kv_stream()]
    for event in sent:
        await endpoint.send(event)
    end = endpoint.connection.kv_end(sent[1].request_id)
    await endpoint.send(end)
    return [*sent, end]


async def receive(endpoint, count: int) -> list:
    events = []
    for _ in range(count):
        event = await endpoint.next_event()
        if isinstance(event, KvChunk):
            event = KvChunk(**{**event.__dict__, "payload": bytes(event.payload), "payload_crc": None})
        events.append(event)
    return events


def comparable(event):
    return KvChunk(**{**event.__dict__, "payload": bytes(event.payload), "payload_crc": None}) \
        if isinstance(event, KvChunk) else event


async def test_corrupt_flips_payload_bits_after_the_crc_so_the_receiver_refuses_the_chunk():
    chain, sender, receiver = await faulted_pair(("c", {"type": "corrupt", "probability": 1.0}))
    asyncio.create_task(send_stream(sender))
    assert isinstance(await receiver.next_event(), Hello)
    await receiver.next_event()  # KvBegin has no payload: untouched
    with pytest.raises(RemoteProtocolError) as caught:
        await receiver.next_event()
    assert caught.value.code == ErrorCode.PAYLOAD_CRC_MISMATCH
    assert chain.describe()[0]["corrupted"] >= 1


async def test_slicer_delivers_every_frame_intact_in_small_pieces():
    _, sender, receiver = await faulted_pair(("s", {"type": "slicer", "average_bytes": 7, "size_variation_bytes": 6}))
    sent = await send_stream(sender)
    got = await receive(receiver, len(sent))
    assert [comparable(e) for e in got] == [comparable(e) for e in sent]


async def test_limit_data_drops_the_connection_after_its_allowance():
    _, sender, receiver = await faulted_pair(("l", {"type": "limit_data", "bytes": 300}))
    with pytest.raises(ConnectionResetError, match="dropped after"):
        await send_stream(sender)
    received = []
    try:
        while (event := await receiver.next_event()) is not None:
            received.append(type(event).__name__)
    except (RemoteProtocolError, ConnectionError):
        pass
    assert "KvEnd" not in received  # the stream never completed: nothing past the allowance arrived


async def test_reset_peer_aborts_the_connection_at_the_first_write_past_its_threshold():
    _, sender, _ = await faulted_pair(("r", {"type": "reset_peer", "after_bytes": 0}))
    with pytest.raises(ConnectionResetError, match="reset after 0 bytes"):
        await send_stream(sender)
    assert sender.is_closing


async def test_a_hanging_timeout_holds_writes_until_it_is_removed_then_lets_them_through():
    chain, sender, receiver = await faulted_pair(("down", {"type": "timeout", "timeout_s": 0}))
    sending = asyncio.create_task(send_stream(sender))
    await asyncio.sleep(0.05)
    assert not sending.done()
    assert chain.delete("down")
    sent = await asyncio.wait_for(sending, 2.0)
    assert len(await receive(receiver, len(sent))) == len(sent)


async def test_a_timeout_with_a_limit_drops_the_connection_when_it_expires():
    _, sender, _ = await faulted_pair(("t", {"type": "timeout", "timeout_s": 0.02}))
    with pytest.raises(ConnectionResetError, match="timed out"):
        await send_stream(sender)


async def test_bandwidth_and_latency_hold_writes_at_least_as_long_as_configured():
    # Fidelity, not speed: a 1 KiB payload stream at 20 kB/s needs >= ~0.1 s; generous lower bounds only.
    _, sender, receiver = await faulted_pair(("b", {"type": "bandwidth", "rate_Bps": 20_000}),
                                             ("l", {"type": "latency", "latency_s": 0.01}))
    start = time.monotonic()
    sent = await send_stream(sender)
    await receive(receiver, len(sent))
    assert time.monotonic() - start >= 0.08


@pytest.mark.parametrize("name,body,message", [
    ("x", {"type": "meteor"}, "unknown type 'meteor'"),
    ("x", {"type": ["latency"]}, "unknown type"),
    ("x", {"type": "latency", "latency_s": -1}, "latency_s must be a number in"),
    ("x", {"type": "corrupt", "probability": "high"}, "probability must be a number"),
    ("x", {"type": "slicer", "speed": 3}, "unknown parameter 'speed'"),
    ("bad name!", {"type": "latency"}, "fault name"),
])
def test_a_bad_fault_is_refused_naming_what_was_wrong(name, body, message):
    with pytest.raises(ConfigError, match=message):
        make_fault(name, body)


def test_the_chain_holds_a_bounded_number_of_faults_and_replaces_by_name():
    chain = FaultChain()
    for i in range(MAX_FAULTS):
        chain.put(make_fault(f"f{i}", {"type": "latency"}))
    chain.put(make_fault("f0", {"type": "latency", "latency_s": 0.5}))  # replacing is always allowed
    assert chain.describe()[-1] == {"name": "f0", "type": "latency", "latency_s": 0.5, "jitter_s": 0.0}
    with pytest.raises(ConfigError, match=f"at most {MAX_FAULTS}"):
        chain.put(make_fault("one-more", {"type": "latency"}))
