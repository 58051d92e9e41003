"""The HTTP server's long answers (runtime/http.py): a streamed body goes out chunk by chunk as it is made; a
client that leaves cancels the handler and closes the stream of a `cancel_on_disconnect` route; an API's own
error shape covers the errors the server answers itself."""

from __future__ import annotations

import asyncio

from kvtransit.runtime.http import HttpServer, HttpStream


async def open_request(server: HttpServer, method: str, path: str):
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readline()).strip(), 16)
    data = await reader.readexactly(size + 2)
    return data[:-2]


async def test_a_stream_is_sent_chunk_by_chunk_as_it_is_made():
    release = asyncio.Event()

    async def chunks():
        yield b"data: one\n\n"
        await release.wait()  # the second chunk is made only after the client has the first
        yield b"data: two\n\n"

    async def handler(_request):
        return HttpStream(chunks())

    server = HttpServer()
    server.route("GET", "/events", handler)
    await server.start()
    try:
        reader, writer = await open_request(server, "GET", "/events")
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in head and b"Content-Type: text/event-stream" in head
        assert await read_chunk(reader) == b"data: one\n\n"
        release.set()
        assert await read_chunk(reader) == b"data: two\n\n"
        assert await read_chunk(reader) == b""  # the last chunk: the body is complete
        writer.close()
    finally:
        await server.close()


async def test_a_client_that_leaves_mid_stream_closes_the_stream_of_a_watched_route():
    closed = asyncio.Event()

    async def chunks():
        try:
            yield b"data: first\n\n"
            await asyncio.Event().wait()  # never more: only the client leaving ends this
        finally:
            closed.set()

    async def handler(_request):
        return HttpStream(chunks())

    server = HttpServer()
    server.route("POST", "/stream", handler, cancel_on_disconnect=True)
    await server.start()
    try:
        reader, writer = await open_request(server, "POST", "/stream")
        await reader.readuntil(b"\r\n\r\n")
        assert await read_chunk(reader) == b"data: first\n\n"
        writer.close()
        await asyncio.wait_for(closed.wait(), 5.0)
    finally:
        await server.close()


async def test_a_client_that_leaves_before_the_answer_cancels_a_watched_handler():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(_request):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server = HttpServer()
    server.route("POST", "/slow", handler, cancel_on_disconnect=True)
    await server.start()
    try:
        _reader, writer = await open_request(server, "POST", "/slow")
        await asyncio.wait_for(started.wait(), 5.0)
        writer.close()
        await asyncio.wait_for(cancelled.wait(), 5.0)
    finally:
        await server.close()


async def test_the_servers_own_errors_take_the_apis_error_shape():
    server = HttpServer(error_body=lambda status, message: {"error": {"message": message, "code": status}})

    async def ok(_request):
        return {}

    server.route("GET", "/here", ok)
    await server.start()
    try:
        for method, path, status in (("GET", "/nowhere", 404), ("POST", "/here", 405)):
            reader, writer = await open_request(server, method, path)
            raw = await reader.read()
            writer.close()
            assert raw.startswith(f"HTTP/1.1 {status} ".encode())
            assert f'"code": {status}'.encode() in raw and b'"message": ' in raw
    finally:
        await server.close()
