"""Endpoint details the conformance suite does not spell out: buffer loans, flow-limit checks, the public ways
to wrap or watch an endpoint, signals."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from kvtransit.runtime import signals
from kvtransit.runtime.transport import Endpoint, FlowLimits, memory_pair
from kvtransit.wire import Role
from kvtransit.wire.events import Error, KvChunk, KvEnd
from kvtransit.wire.limits import MAX_MESSAGE
from tests._endpoints import hello, kv_chunk, kv_stream_pair

SIZE = 256 * 1024


async def test_a_send_of_borrowed_memory_returns_only_once_the_transport_let_go_of_it():
    # The memory transport keeps views of what it is given until the peer reads them, as uvloop does, and
    # 256 KiB is well under the write high-water mark, so flow control alone would not make send() wait.
    a, b = await kv_stream_pair(1, n_chunks=2, chunk_bytes=SIZE)
    buffer = bytearray(b"\x07" * SIZE)
    await a.send(kv_chunk(1, 0, buffer))
    buffer[:] = b"\x00" * SIZE  # the sender reuses its buffer as soon as send() returned
    received = await b.next_event()
    assert bytes(received.payload) == b"\x07" * SIZE


async def test_a_payload_view_is_taken_back_at_the_next_call():
    a, b = await kv_stream_pair(1, n_chunks=2, chunk_bytes=SIZE)
    await a.send(kv_chunk(1, 0, b"\x01" * SIZE))
    await a.send(kv_chunk(1, 1, b"\x02" * SIZE))
    first = await b.next_event()
    assert bytes(first.payload[:4]) == b"\x01" * 4
    second = await b.next_event()
    assert bytes(second.payload[:4]) == b"\x02" * 4
    with pytest.raises(ValueError, match="released"):  # kept past its loan: a loud error, never newer bytes
        bytes(first.payload)


@pytest.mark.parametrize("kwargs,message", [
    ({"write_high_bytes": 0}, "write_high_bytes must be > 0"),
    ({"write_high_bytes": 10, "write_low_bytes": 11}, "write_low_bytes must be in 0..write_high_bytes"),
    ({"read_size": -1}, "read_size must be > 0"),
])
def test_flow_limits_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlowLimits(**kwargs)


async def test_an_endpoint_is_closed_only_once_its_connection_is_gone():
    a, b = memory_pair(Role.PREFILL, Role.MIDDLEBOX)
    assert not a.is_closed and not a.is_closing
    a.close()
    assert a.is_closing
    await asyncio.wait_for(a.wait_closed(), 5)
    assert a.is_closed
    assert await b.next_event() is None  # the peer saw a clean close
    await asyncio.wait_for(b.aclose(), 5)
    assert b.is_closed


async def test_a_subclass_built_from_an_endpoint_takes_over_its_send_side():
    class Counting(Endpoint):
        def __init__(self, endpoint: Endpoint):
            super().__init__(endpoint)
            self.writes: list[int] = []

        async def write_parts(self, parts):
            self.writes.append(sum(memoryview(p).nbytes for p in parts))
            await super().write_parts(parts)

    a, b = await kv_stream_pair(1, n_chunks=1, chunk_bytes=SIZE)
    wrapped = Counting(a)
    await wrapped.send(kv_chunk(1, 0, b"\x03" * SIZE))
    await wrapped.send(wrapped.connection.kv_end(1))  # same sans-IO connection: the stream it began goes on
    got = await b.next_event()
    assert isinstance(got, KvChunk) and bytes(got.payload[:4]) == b"\x03" * 4
    assert len(wrapped.writes) == 2 and wrapped.writes[0] > SIZE
    end = await b.next_event()  # its CRC over the payload checked by the receiver
    assert isinstance(end, KvEnd) and end.request_id == 1
    wrapped.abort()
    await asyncio.wait_for(a.wait_closed(), 5)  # one connection under both objects
    assert a.is_closed


async def test_an_error_message_is_clipped_to_the_wire_byte_limit_even_when_not_ascii():
    a, b = memory_pair(Role.MIDDLEBOX, Role.PREFILL)
    await a.send(hello(Role.MIDDLEBOX))
    assert await a.send_error(RuntimeError("é" * 2000))  # 4,000 UTF-8 bytes
    await b.next_event()
    error = await b.next_event()
    assert isinstance(error, Error)
    assert 0 < len(error.message.encode()) <= MAX_MESSAGE and set(error.message) == {"é"}


async def test_sigterm_requests_shutdown_and_a_second_signal_forces_it():
    with signals.Shutdown() as shutdown:
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(shutdown.wait(), 5) == "SIGTERM"
        assert not shutdown.forced.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(shutdown.forced.wait(), 5)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


async def test_sigusr1_writes_where_every_task_waits_and_stops_nothing(capfd):
    """A process that seems stuck says where: each task's await chain down to what it is suspended in."""
    parked = asyncio.Event()

    async def waits_inside() -> None:
        await parked.wait()

    async def outer() -> None:
        await waits_inside()

    task = asyncio.create_task(outer(), name="the parked one")
    await asyncio.sleep(0)
    with signals.Shutdown() as shutdown:
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.2)  # the loop runs the handler once it sees the signal (its wake-up fd)
        assert not shutdown.requested.is_set()
    err = capfd.readouterr().err
    parked.set()
    await task
    assert f"asyncio task(s) of pid {os.getpid()}" in err
    chain = err.split("task 'the parked one':\n", 1)[1].splitlines()
    assert "in outer" in chain[0] and "in waits_inside" in chain[1] and "in wait" in chain[2]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is gone with the context
