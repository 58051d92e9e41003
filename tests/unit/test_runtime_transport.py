"""Endpoint details the conformance suite does not spell out: buffer loans, flow-limit checks, signals."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from kvtransit.runtime.transport import FlowLimits, Shutdown, memory_pair
from kvtransit.wire import Role
from kvtransit.wire.events import DType, Hello, KvBegin, KvChunk
from kvtransit.wire.limits import WIRE_VERSION

SIZE = 256 * 1024


async def kv_pair(limits=FlowLimits()):
    a, b = memory_pair(Role.PREFILL, Role.MIDDLEBOX, limits=limits)
    await a.send(Hello(role=Role.PREFILL, version=WIRE_VERSION, name="p"))
    await a.send(KvBegin(request_id=1, prompt_tokens=1, output_tokens=1, n_layers=2, n_chunks=2,
                         raw_bytes=2 * SIZE, codec="none", first_token_ns=0))
    assert isinstance(await b.next_event(), Hello)
    assert isinstance(await b.next_event(), KvBegin)
    return a, b


def chunk(index: int, payload) -> KvChunk:
    return KvChunk(request_id=1, layer=index, chunk=index, dtype=DType.U8, shape=(SIZE,), codec_id=0,
                   codec_header=b"", payload=payload, raw_bytes=SIZE)


async def test_a_send_of_borrowed_memory_returns_only_once_the_transport_let_go_of_it():
    # The memory transport keeps views of what it is given until the peer reads them, as uvloop does, and
    # 256 KiB is well under the write high-water mark, so flow control alone would not make send() wait.
    a, b = await kv_pair()
    buffer = bytearray(b"\x07" * SIZE)
    await a.send(chunk(0, buffer))
    buffer[:] = b"\x00" * SIZE  # the sender reuses its buffer as soon as send() returned
    received = await b.next_event()
    assert bytes(received.payload) == b"\x07" * SIZE


async def test_a_payload_view_is_taken_back_at_the_next_call():
    a, b = await kv_pair()
    await a.send(chunk(0, b"\x01" * SIZE))
    await a.send(chunk(1, b"\x02" * SIZE))
    first = await b.next_event()
    assert bytes(first.payload[:4]) == b"\x01" * 4
    second = await b.next_event()
    assert bytes(second.payload[:4]) == b"\x02" * 4
    with pytest.raises(ValueError):  # kept past its loan: a loud error, never newer bytes
        bytes(first.payload)


@pytest.mark.parametrize("kwargs,message", [
    ({"write_high_bytes": 0}, "write_high_bytes must be > 0"),
    ({"write_high_bytes": 10, "write_low_bytes": 11}, "write_low_bytes must be in 0..write_high_bytes"),
    ({"read_size": -1}, "read_size must be > 0"),
])
def test_flow_limits_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlowLimits(**kwargs)


async def test_sigterm_requests_shutdown_and_a_second_signal_forces_it():
    with Shutdown() as shutdown:
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(shutdown.wait(), 5) == "SIGTERM"
        assert not shutdown.forced.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(shutdown.forced.wait(), 5)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
