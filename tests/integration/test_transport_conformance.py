"""One conformance suite for every transport (trio/anyio style): in-memory pairs and loopback TCP, each on the
stdlib loop and on uvloop. Whatever an agent may rely on is pinned here once."""

from __future__ import annotations

import asyncio
import os

import pytest
import uvloop

from kvtransit.runtime.transport import FlowLimits, Server, serve, serve_memory
from kvtransit.wire import ErrorCode, RemoteProtocolError, Role
from kvtransit.wire.events import Ack, AckStatus, Bye, Error, FirstToken, KvBegin, KvChunk, Request, TokenEntry, Tokens
from tests._endpoints import collect, hello, kv_begin, kv_chunk

pytestmark = [pytest.mark.timeout(60),
              # Parametrising the loop through event_loop_policy is deprecated in pytest-asyncio 1.x in favour
              # of a conftest hook that would apply to every test; this file is the only one that needs it.
              pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture")]


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request):
    return uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()


@pytest.fixture(params=["memory", "tcp"])
def start_server(request):
    """start_server(handler, our_role, their_role, limits=...) -> Server, over this transport."""

    async def start(handler, our_role, their_role, limits: FlowLimits | None = None) -> Server:
        limits = limits or FlowLimits()
        if request.param == "memory":
            return serve_memory(handler, our_role, their_role, limits=limits)
        return await serve("127.0.0.1", 0, handler, our_role, their_role, limits=limits)

    return start


# Every event type, on the hop that carries it: (client role, server role, client sends, server sends).
# Entries that are callables are built from the sending endpoint (KvEnd's checksum comes from the connection).
KV_CHUNKS = [kv_chunk(7, 0, b"\x01" * 1000), kv_chunk(7, 1, bytes(range(256)) * 3)]
HOPS = [
    (Role.LOADGEN, Role.PREFILL,
     [hello(Role.LOADGEN), Request(request_id=1, prompt_tokens=2048, output_tokens=256, sent_ns=123), Bye("done")],
     [hello(Role.PREFILL), FirstToken(request_id=1, t_ns=456),
      Error(code=ErrorCode.OVERLOADED, message="queue full", request_id=2), Bye()]),
    (Role.PREFILL, Role.MIDDLEBOX,
     [hello(Role.PREFILL),
      KvBegin(request_id=7, prompt_tokens=2, output_tokens=3, n_layers=2, n_chunks=2,
              raw_bytes=sum(c.raw_bytes for c in KV_CHUNKS), codec="none", first_token_ns=99),
      *KV_CHUNKS, lambda ep: ep.connection.kv_end(7), Bye()],
     [hello(Role.MIDDLEBOX), Ack(request_id=7, status=AckStatus.OK, t_ns=5, detail="stored"), Bye()]),
    (Role.LOADGEN, Role.DECODE,
     [hello(Role.LOADGEN), Bye()],
     [hello(Role.DECODE), Tokens(entries=(TokenEntry(1, 1, 10), TokenEntry(2, 5, 11))), Bye()]),
]


async def send_all(endpoint, script) -> list:
    sent = []
    for item in script:
        event = item(endpoint) if callable(item) else item
        await endpoint.send(event)
        sent.append(event)
    return sent


@pytest.mark.parametrize("client_role,server_role,client_script,server_script", HOPS,
                         ids=[f"{a.name.lower()}-{b.name.lower()}" for a, b, *_ in HOPS])
async def test_every_event_type_round_trips(start_server, client_role, server_role, client_script, server_script):
    server_got: asyncio.Future[list] = asyncio.get_running_loop().create_future()

    async def handler(endpoint):
        sender = asyncio.create_task(send_all(endpoint, server_script))
        server_got.set_result(await collect(endpoint))
        await sender

    server = await start_server(handler, server_role, client_role)
    async with server:
        client = await server.connect()
        sent = await send_all(client, client_script)
        client_got = await collect(client)
        await client.aclose()
        assert await server_got == sent
        assert client_got == server_script


async def test_a_large_payload_arrives_intact(start_server):
    payload = os.urandom(32 * 1024 * 1024)
    received: asyncio.Future[KvChunk] = asyncio.get_running_loop().create_future()

    async def handler(endpoint):
        events = await collect(endpoint)
        received.set_result(next(e for e in events if isinstance(e, KvChunk)))

    server = await start_server(handler, Role.MIDDLEBOX, Role.PREFILL)
    async with server:
        client = await server.connect()
        await client.send(hello(Role.PREFILL))
        await client.send(kv_begin(1, len(payload)))
        await client.send(kv_chunk(1, 0, payload))
        await client.send(client.connection.kv_end(1))
        await client.aclose()
        got = await received
        assert got.raw_bytes == len(payload)
        assert got.payload == payload


async def test_a_slow_reader_makes_the_writer_wait_with_bounded_memory(start_server):
    limits = FlowLimits(write_high_bytes=512 * 1024, write_low_bytes=128 * 1024, read_high_bytes=512 * 1024)
    n_chunks, size = 96, 1024 * 1024
    reader_may_go = asyncio.Event()
    received: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    peak_buffer = 0

    async def handler(endpoint):
        nonlocal peak_buffer
        await reader_may_go.wait()
        seen = []
        async for event in endpoint:
            peak_buffer = max(peak_buffer, endpoint.connection.buffer_capacity)
            if isinstance(event, KvChunk):
                assert bytes(event.payload[:8]) == event.chunk.to_bytes(8, "little")
                seen.append(event.chunk)
        received.set_result(seen)

    server = await start_server(handler, Role.MIDDLEBOX, Role.PREFILL, limits)
    async with server:
        client = await server.connect(limits=limits)
        sent = 0

        async def writer():
            nonlocal sent
            await client.send(hello(Role.PREFILL))
            await client.send(kv_begin(1, n_chunks * size, n_chunks))
            for i in range(n_chunks):
                await client.send(kv_chunk(1, i, i.to_bytes(8, "little") * (size // 8)))
                sent += 1
            await client.send(client.connection.kv_end(1))

        task = asyncio.create_task(writer())
        # Let the writer fill every buffer on the way (user space and, for TCP, the kernel's).
        previous = -1
        while sent != previous:
            previous = sent
            await asyncio.sleep(0.2)
        assert not task.done(), "the writer finished although nobody was reading"
        assert sent * size < 40 * 1024 * 1024, f"{sent} MiB went out with the reader stalled: buffers unbounded"
        reader_may_go.set()
        await task
        await client.aclose()
        assert await received == list(range(n_chunks))
        # One frame plus one read plus the read high-water mark, never the whole stream.
        assert peak_buffer <= 4 * size


async def test_a_peer_closing_mid_frame_fails_only_its_own_connection(start_server):
    outcomes: dict[str, object] = {}
    b_done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def handler(endpoint):
        first = await endpoint.next_event()
        try:
            events = await collect(endpoint)
        except RemoteProtocolError as exc:
            outcomes[first.name] = exc
            raise
        outcomes[first.name] = events
        if first.name == "b":
            b_done.set_result(len(events))

    server = await start_server(handler, Role.MIDDLEBOX, Role.PREFILL)
    async with server:
        a = await server.connect()
        b = await server.connect()
        await a.send(hello(Role.PREFILL, "a"))
        await b.send(hello(Role.PREFILL, "b"))
        await a.send(kv_begin(1, 4096))
        head, payload = a.connection.send_parts(kv_chunk(1, 0, b"\x05" * 4096))
        async with a.exclusive():
            await a.write_parts([head, payload[:100]])  # then hang up in the middle of the payload
        a.close()
        # b carries on, on the same server, after a has failed.
        await b.send(kv_begin(1, 4096))
        await b.send(kv_chunk(1, 0, b"\x06" * 4096))
        await b.send(b.connection.kv_end(1))
        await b.aclose()
        assert await b_done == 3
        for _ in range(100):
            if "a" in outcomes:
                break
            await asyncio.sleep(0.01)
        assert isinstance(outcomes["a"], RemoteProtocolError)
        assert outcomes["a"].code == ErrorCode.TRUNCATED
        assert isinstance(outcomes["b"], list)
    assert server.connections_failed == 1


async def test_graceful_shutdown_drains_until_the_deadline_then_cancels(start_server):
    finished, cancelled = asyncio.Event(), asyncio.Event()
    never, both_greeted = asyncio.Event(), asyncio.Event()
    greeted: list[str] = []

    async def handler(endpoint):
        first = await endpoint.next_event()
        greeted.append(first.name)
        if len(greeted) == 2:
            both_greeted.set()
        if first.name == "quick":
            await collect(endpoint)  # finishes when the client hangs up, during the drain
            finished.set()
            return
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server = await start_server(handler, Role.MIDDLEBOX, Role.PREFILL)
    quick = await server.connect()
    stuck = await server.connect()
    await quick.send(hello(Role.PREFILL, "quick"))
    await stuck.send(hello(Role.PREFILL, "stuck"))
    await both_greeted.wait()
    assert server.active_connections == 2

    shutdown = asyncio.create_task(server.shutdown(deadline_s=0.5))
    await asyncio.sleep(0.05)
    with pytest.raises(ConnectionError):
        await server.connect()  # no longer accepting
    assert not shutdown.done() and not cancelled.is_set()  # still draining
    await quick.aclose()
    await shutdown
    assert finished.is_set()
    assert cancelled.is_set()
    assert server.active_connections == 0
    stuck.abort()


async def test_an_endpoint_is_closed_once_the_server_side_hangs_up(start_server):
    async def handler(endpoint):
        await endpoint.send(hello(Role.MIDDLEBOX))  # then return: the server closes the connection

    server = await start_server(handler, Role.MIDDLEBOX, Role.PREFILL)
    async with server:
        client = await server.connect()
        assert await collect(client) == [hello(Role.MIDDLEBOX)]
        client.close()
        await asyncio.wait_for(client.wait_closed(), 5)
        assert client.is_closed and client.is_closing


async def test_open_greeted_says_hello_and_returns_once_the_peer_said_it():
    from kvtransit.runtime.transport import open_greeted, serve
    from kvtransit.wire.events import Hello, Role

    async def server_side(endpoint):
        first = await endpoint.next_event()
        assert isinstance(first, Hello) and first.name == "prefill-9"
        await endpoint.send(Hello(role=Role.MIDDLEBOX, version=1, name="mb"))
        await endpoint.next_event()  # until the client's Bye or close

    server = await serve("127.0.0.1", 0, server_side, Role.MIDDLEBOX, Role.PREFILL)
    try:
        client = await open_greeted("127.0.0.1", server.port, Role.PREFILL, Role.MIDDLEBOX, name="prefill-9",
                                    timeout_s=5)
        assert await client.goodbye("done") is True
        client.close()
    finally:
        await server.shutdown(1.0)


async def test_open_greeted_refuses_a_peer_that_answers_something_else():
    import pytest

    from kvtransit.runtime.transport import open_greeted, serve
    from kvtransit.wire.events import Bye, Role

    async def server_side(endpoint):
        await endpoint.next_event()
        await endpoint.send(Bye(reason="not today"))

    server = await serve("127.0.0.1", 0, server_side, Role.MIDDLEBOX, Role.PREFILL)
    try:
        with pytest.raises(ConnectionError, match="did not say Hello"):
            await open_greeted("127.0.0.1", server.port, Role.PREFILL, Role.MIDDLEBOX, name="p", timeout_s=5)
    finally:
        await server.shutdown(1.0)
