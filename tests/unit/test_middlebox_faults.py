"""The middlebox's fault stages (agents/middlebox/faults/), each on a real wire connection in memory.

Faults that hold writes wait on the middlebox's clock: here a ManualClock, stepped by hand, so their timing is
pinned exactly and no test sleeps."""

from __future__ import annotations

import asyncio

import pytest

from kvtransit.agents.middlebox.faults import MAX_FAULTS, FaultChain, FaultedEndpoint, make_fault
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.clock import ManualClock
from kvtransit.runtime.transport import memory_pair
from kvtransit.wire import ErrorCode, RemoteProtocolError, Role
from kvtransit.wire.events import Hello, KvChunk

from ._wire_samples import kv_stream


async def faulted_pair(*faults: tuple[str, dict], clock: ManualClock | None = None):
    chain = FaultChain()
    for name, body in faults:
        chain.put(make_fault(name, body, clock=clock))
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
    sending = asyncio.create_task(send_stream(sender))
    assert isinstance(await receiver.next_event(), Hello)
    await receiver.next_event()  # KvBegin has no payload: untouched
    with pytest.raises(RemoteProtocolError) as caught:
        await receiver.next_event()
    assert caught.value.code == ErrorCode.PAYLOAD_CRC_MISMATCH
    assert chain.describe()[0]["corrupted"] >= 1
    await asyncio.wait_for(sending, 2.0)  # the sender saw nothing wrong: only the receiver's CRC check can


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
    clock = ManualClock()
    chain, sender, receiver = await faulted_pair(("down", {"type": "timeout", "timeout_s": 0}), clock=clock)
    sending = asyncio.create_task(send_stream(sender))
    await clock.advance(3600.0)  # an hour later: still held, not dropped
    assert not sending.done()
    assert chain.delete("down")
    sent = await asyncio.wait_for(sending, 2.0)
    assert len(await receive(receiver, len(sent))) == len(sent)


async def test_a_timeout_with_a_limit_drops_the_connection_when_it_expires_on_the_clock():
    clock = ManualClock()
    _, sender, _ = await faulted_pair(("t", {"type": "timeout", "timeout_s": 0.02}), clock=clock)
    sending = asyncio.create_task(send_stream(sender))
    await clock.advance(0.019)
    assert not sending.done()
    await clock.advance(0.002)
    with pytest.raises(ConnectionResetError, match="timed out"):
        await asyncio.wait_for(sending, 2.0)
    assert sender.is_closing


class WriteLog:
    """The next write in the chain: records when (clock ns) each write went through, and its bytes."""

    def __init__(self, clock: ManualClock):
        self.clock = clock
        self.writes: list[tuple[int, bytes]] = []

    async def __call__(self, parts) -> None:
        self.writes.append((self.clock.now_ns(), b"".join(bytes(p) for p in parts)))


async def test_bandwidth_releases_each_write_when_the_capped_rate_has_carried_it():
    clock = ManualClock()
    fault, log = make_fault("b", {"type": "bandwidth", "rate_Bps": 1000}, clock=clock), WriteLog(clock)
    # Two 500-byte writes back to back at 1,000 B/s: the first is through at 0.5 s, the second at 1.0 s.
    writing = asyncio.gather(fault.write([b"a" * 500], log, None), fault.write([b"b" * 500], log, None))
    await clock.advance(0.499)
    assert log.writes == []
    await clock.advance(0.001)
    assert [t for t, _ in log.writes] == [500_000_000]
    await clock.advance(0.5)
    await writing
    assert [(t, data[:1]) for t, data in log.writes] == [(500_000_000, b"a"), (1_000_000_000, b"b")]


async def test_bandwidth_does_not_bank_idle_time_as_a_burst():
    clock = ManualClock()
    fault, log = make_fault("b", {"type": "bandwidth", "rate_Bps": 1000}, clock=clock), WriteLog(clock)
    await clock.advance(10.0)  # idle for 10 s: a write after that still pays its own serialisation
    writing = asyncio.ensure_future(fault.write([b"x" * 100], log, None))
    await clock.advance(0.1)
    await writing
    assert log.writes[0][0] == 10_100_000_000


async def test_latency_holds_each_write_for_its_latency():
    clock = ManualClock()
    fault, log = make_fault("l", {"type": "latency", "latency_s": 0.05}, clock=clock), WriteLog(clock)
    writing = asyncio.ensure_future(fault.write([b"frame"], log, None))
    await clock.advance(0.049)
    assert log.writes == []
    await clock.advance(0.001)
    await writing
    assert log.writes == [(50_000_000, b"frame")]


async def test_latency_jitter_stays_within_its_bounds():
    clock = ManualClock()
    fault = make_fault("j", {"type": "latency", "latency_s": 0.05, "jitter_s": 0.01}, clock=clock)
    log = WriteLog(clock)
    for _ in range(20):
        start = clock.now_ns()
        writing = asyncio.ensure_future(fault.write([b"x"], log, None))
        await clock.advance(0.061)
        await writing
        assert 40_000_000 <= log.writes[-1][0] - start <= 60_000_000


async def test_slicer_spaces_its_pieces_by_its_delay_on_the_clock():
    clock = ManualClock()
    fault = make_fault("s", {"type": "slicer", "average_bytes": 4, "size_variation_bytes": 0, "delay_s": 0.01},
                       clock=clock)
    log = WriteLog(clock)
    writing = asyncio.ensure_future(fault.write([b"abcdefghijkl"], log, None))
    await clock.advance(0.1)
    await writing
    assert log.writes == [(0, b"abcd"), (10_000_000, b"efgh"), (20_000_000, b"ijkl")]


async def test_bandwidth_and_latency_on_a_connection_deliver_every_frame_once_the_clock_has_moved():
    clock = ManualClock()
    _, sender, receiver = await faulted_pair(("b", {"type": "bandwidth", "rate_Bps": 20_000}),
                                             ("l", {"type": "latency", "latency_s": 0.01}), clock=clock)
    sending = asyncio.create_task(send_stream(sender))
    await clock.advance(0.005)
    assert not sending.done()  # the first write is still inside the bandwidth cap's hold
    await clock.advance(10.0)
    sent = await asyncio.wait_for(sending, 2.0)
    got = await receive(receiver, len(sent))
    assert [comparable(e) for e in got] == [comparable(e) for e in sent]


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
