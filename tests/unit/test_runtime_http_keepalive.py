"""Persistent connections on the house HTTP server (runtime/http.py, `keep_alive=True`): requests on one connection
are answered in order, `Connection: close` and HTTP/1.0 close it, an idle one is closed, a request the server cannot
read is refused and its connection closed; a streamed answer still ends where it should; each request carries when
its first byte arrived."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvtransit.runtime.http import HttpServer, HttpStream

# Waits in these tests bound a hang, they time nothing: generous, so a loaded machine does not fail them.
GENEROUS_S = 10.0


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer off the stream, framed by its Content-Length or its chunks (never by the close)."""
    status_line = await asyncio.wait_for(reader.readline(), GENEROUS_S)
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers: dict[str, str] = {}
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readline()).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        assert await reader.readexactly(2) == b"\r\n"  # the last chunk's empty trailer
    else:
        body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server has closed the connection (EOF), with nothing more sent on it."""
    return await asyncio.wait_for(reader.read(), GENEROUS_S) == b""


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def get(path: str, *extra: str, version: str = "HTTP/1.1") -> bytes:
    return ("\r\n".join([f"GET {path} {version}", "Host: x", *extra]) + "\r\n\r\n").encode()


@pytest.fixture
async def server():
    http = HttpServer(keep_alive=True)

    async def echo(request):
        return {"got": request.json(), "path": request.path}

    async def events(_request):
        async def chunks():
            for word in (b"data: one\n\n", b"data: two\n\n"):
                yield word
        return HttpStream(chunks())

    http.route("POST", "/echo", echo)
    http.route("GET", "/events", events)
    http.route("POST", "/watched", echo, cancel_on_disconnect=True)
    await http.start()
    yield http
    await http.close()


async def connect(http: HttpServer):
    return await asyncio.open_connection(http.host, http.port)


async def test_two_requests_one_after_the_other_on_one_connection_get_two_answers(server):
    reader, writer = await connect(server)
    for n in (1, 2):
        writer.write(post("/echo", json.dumps({"n": n}).encode()))
        status, headers, body = await read_answer(reader)
        assert status == 200 and json.loads(body) == {"got": {"n": n}, "path": "/echo"}
        assert "connection" not in headers  # HTTP/1.1: kept without saying so
    writer.close()


async def test_pipelined_requests_are_answered_in_the_order_they_were_sent(server):
    reader, writer = await connect(server)
    writer.write(post("/echo", b'{"n": 1}') + get("/events") + post("/echo", b'{"n": 3}'))
    first, second, third = [await read_answer(reader) for _ in range(3)]
    assert json.loads(first[2])["got"] == {"n": 1}
    assert second[2] == b"data: one\n\ndata: two\n\n"
    assert json.loads(third[2])["got"] == {"n": 3}
    writer.close()


async def test_a_request_pipelined_behind_a_watched_one_is_kept_and_answered(server):
    """The disconnect watcher reads while the first answer is made; what it read is the next request."""
    reader, writer = await connect(server)
    writer.write(post("/watched", b'{"n": 1}') + post("/watched", b'{"n": 2}'))
    answers = [json.loads((await read_answer(reader))[2])["got"] for _ in range(2)]
    assert answers == [{"n": 1}, {"n": 2}]
    writer.close()


async def test_a_streamed_answer_ends_with_its_last_chunk_and_the_connection_serves_on(server):
    reader, writer = await connect(server)
    writer.write(get("/events"))
    status, headers, body = await read_answer(reader)
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert body == b"data: one\n\ndata: two\n\n"
    writer.write(post("/echo", b"{}"))
    assert (await read_answer(reader))[0] == 200
    writer.close()


async def test_connection_close_is_honoured_after_the_answer(server):
    reader, writer = await connect(server)
    writer.write(post("/echo", b'{"n": 1}', "Connection: close"))
    status, headers, _body = await read_answer(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()


async def test_http_1_0_closes_unless_it_asks_for_keep_alive(server):
    reader, writer = await connect(server)
    writer.write(get("/events", "Connection: keep-alive", version="HTTP/1.0"))
    # A stream to HTTP/1.0 is close-delimited (it knows no chunked encoding), so even a kept-alive ask ends here.
    raw = await asyncio.wait_for(reader.read(), GENEROUS_S)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and b"Connection: close" in head
    assert body == b"data: one\n\ndata: two\n\n"
    writer.close()

    reader, writer = await connect(server)
    writer.write(post("/echo", b"{}").replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    status, headers, _ = await read_answer(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()

    reader, writer = await connect(server)
    writer.write(post("/echo", b"{}", "Connection: keep-alive").replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    status, headers, _ = await read_answer(reader)
    assert status == 200 and headers["connection"] == "keep-alive"
    writer.write(post("/echo", b"{}"))  # still open: a second request is served
    assert (await read_answer(reader))[0] == 200
    writer.close()


async def test_an_idle_connection_is_closed_after_the_idle_timeout():
    http = HttpServer(keep_alive=True, idle_timeout_s=0.2)

    async def ok(_request):
        return {}

    http.route("GET", "/ok", ok)
    await http.start()
    try:
        reader, writer = await connect(http)
        writer.write(get("/ok"))
        assert (await read_answer(reader))[0] == 200
        assert await closed_by_server(reader)  # nothing more sent: the server lets it go
        writer.close()
    finally:
        await http.close()


async def test_a_malformed_second_request_gets_a_400_and_a_close_the_first_answer_intact(server):
    reader, writer = await connect(server)
    writer.write(post("/echo", b'{"n": 1}') + b"NONSENSE\r\nHost: x\r\n\r\n")
    status, _, body = await read_answer(reader)
    assert status == 200 and json.loads(body)["got"] == {"n": 1}
    status, headers, body = await read_answer(reader)
    assert status == 400 and headers["connection"] == "close"
    assert json.loads(body) == {"error": "malformed request line 'NONSENSE'"}
    assert await closed_by_server(reader)
    writer.close()


async def test_an_answered_error_keeps_the_connection_when_the_request_was_read_whole(server):
    reader, writer = await connect(server)
    writer.write(get("/nowhere") + post("/echo", b"{}"))
    assert (await read_answer(reader))[0] == 404
    assert (await read_answer(reader))[0] == 200
    writer.close()


async def test_a_body_over_the_limit_is_refused_and_its_connection_closed():
    """The unread body would be taken for the next request: the connection cannot go on."""
    http = HttpServer(keep_alive=True, max_body_bytes=10)

    async def ok(_request):
        return {}

    http.route("POST", "/ok", ok)
    await http.start()
    try:
        reader, writer = await connect(http)
        writer.write(post("/ok", b"x" * 11))
        status, headers, _ = await read_answer(reader)
        assert status == 413 and headers["connection"] == "close"
        assert await closed_by_server(reader)
        writer.close()
    finally:
        await http.close()


async def test_without_keep_alive_every_answer_closes_its_connection():
    """The agents' servers (the default): one request per connection, as the house client expects."""
    http = HttpServer()

    async def ok(_request):
        return {}

    http.route("GET", "/ok", ok)
    await http.start()
    try:
        reader, writer = await connect(http)
        writer.write(get("/ok") + get("/ok"))
        status, headers, _ = await read_answer(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await closed_by_server(reader)  # the second request is not served
        writer.close()
    finally:
        await http.close()


async def test_closing_the_server_closes_its_idle_connections(server):
    reader, writer = await connect(server)
    writer.write(get("/events"))
    await read_answer(reader)
    await server.close()
    assert await closed_by_server(reader)
    writer.close()


async def test_a_request_is_stamped_when_its_first_byte_arrived_not_when_its_body_was_whole():
    """The clock moves while the body is still coming: the stamp is the time the request's first bytes came in."""
    now = {"ns": 1_000}
    read = asyncio.Event()  # the clock is read once per read off the socket

    def now_ns() -> int:
        read.set()
        return now["ns"]

    seen: list[int] = []
    http = HttpServer(keep_alive=True, now_ns=now_ns)

    async def stamp(request):
        seen.append(request.arrived_ns)
        return {}

    http.route("POST", "/stamp", stamp)
    await http.start()
    try:
        reader, writer = await connect(http)
        request = post("/stamp", b'{"prompt": "' + b"x" * 1000 + b'"}')
        writer.write(request[:40])  # the request line and part of the head
        await writer.drain()
        await asyncio.wait_for(read.wait(), GENEROUS_S)  # the server has read them
        now["ns"] = 9_000
        writer.write(request[40:])
        assert (await read_answer(reader))[0] == 200
        assert seen == [1_000]

        writer.write(post("/stamp", b"{}"))  # the next request on the connection: stamped when it came
        assert (await read_answer(reader))[0] == 200
        assert seen == [1_000, 9_000]
        writer.close()
    finally:
        await http.close()
