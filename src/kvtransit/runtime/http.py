"""A tiny asyncio HTTP/1.1 server: `/metrics` for Prometheus and JSON control routes (toxiproxy's api.go).

No dependency beyond the stdlib and prometheus_client. Binds 127.0.0.1 by default; an optional bearer token
guards every route not registered `public=True`.

    http = HttpServer(registry=registry, token=None)
    http.route("POST", "/link/rate", set_rate)     # async def set_rate(request) -> JSON-able | HttpResponse
    await http.start(port=9100)

Connections: by default one request per connection (`Connection: close`): the agents' scrapes and control calls
are rare, and the house client (runtime/http_client.py) reads an answer to the server's close. `keep_alive=True`
(the OpenAI front end, agents/frontend/serving.py) makes connections persistent as HTTP/1.1 says: an HTTP/1.1
request keeps its connection unless it says `Connection: close`, an HTTP/1.0 one only if it says `Connection:
keep-alive`; requests on one connection (sequential or pipelined) are answered in order; a connection idle for
`idle_timeout_s` between requests is closed; a request the server cannot read (a bad head, a body too large or
too slow) is answered and its connection closed, since what follows it on the stream cannot be trusted. A load
tool's connection pool then reuses one connection, as it does against vLLM, instead of paying a TCP connect per
request inside its TTFT.

Each request carries `arrived_ns`: when its first byte arrived (on the server's `now_ns` clock, the testbed's
injected clock for the front end), so the time spent receiving its body, parsing and tokenizing it counts in
the latency a handler measures from it, as it does in a tool's TTFT.

Long answers (the OpenAI front end, agents/frontend/): a handler may return an `HttpStream`, whose chunks are
sent as they come (chunked transfer encoding: server-sent events need no Content-Length up front; to an HTTP/1.0
client, which knows no chunked encoding, the body is close-delimited). A route registered
`cancel_on_disconnect=True` has its handler, and the stream it returns, cancelled when the client closes its
side of the connection, so the work behind an abandoned request stops (the handler sees CancelledError); bytes
the client sends meanwhile (its next request, pipelined) are kept for after the answer. `error_body(status,
message)` shapes every error the server itself answers (404, 405, bad head, ...) for APIs with their own error
shape; by default {"error": message}.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvtransit.runtime.http_incoming import ClientGone, HeadTooLong, IncomingBytes, unless_client_leaves

log = logging.getLogger(__name__)

# Control bodies are a few small JSON fields; 1 MiB is far above any real one and bounds a bad client.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Request line + headers; anything larger is not a control call.
MAX_HEAD_BYTES = 16 * 1024
# A client that connects and says nothing is dropped after this; a head (or a body) begun must be whole within it.
HEAD_TIMEOUT_S = 10.0
# A persistent connection idle this long between requests is closed. Longer than the pools of the clients that drive
# the front end keep an idle connection (httpx's keepalive_expiry 5 s: the openai client, GuideLLM; aiohttp's
# keepalive_timeout 15 s), so the client lets a connection go first and a request never crosses the server's close
# on the wire (vLLM's uvicorn closes at 5 s, VLLM_HTTP_TIMEOUT_KEEP_ALIVE, where that race is open to httpx).
IDLE_TIMEOUT_S = 20.0
# close() waits this long for the idle connections it closed to end: each ends within a loop turn or two (it reads
# its own end of stream); the bound only keeps a stuck handler from holding a shutdown.
CLOSE_WAIT_S = 1.0



class HttpError(Exception):
    """Raise from a handler to answer `status` with {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class HttpRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes
    version: str = "HTTP/1.1"
    arrived_ns: int = 0  # when the request's first byte arrived, on the server's `now_ns` clock

    def json(self) -> Any:
        """The body as JSON (an empty body is None); bad JSON is a 400 naming where it broke."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HttpError(400, f"request body is not valid JSON: {exc}") from None


@dataclass
class HttpResponse:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, data: Any, status: int = 200) -> HttpResponse:
        return cls(status, json.dumps(data, allow_nan=False).encode() + b"\n")


@dataclass
class HttpStream:
    """A response whose body is sent chunk by chunk as `chunks` yields them (Transfer-Encoding: chunked), e.g.
    server-sent events. `chunks` is closed (aclose) when the client goes away or the server stops mid-stream."""

    chunks: AsyncGenerator[bytes, None]
    status: int = 200
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)
    # Set by the server for a route registered `cancel_on_disconnect=True`: the client leaving stops the stream.
    cancel_on_disconnect: bool = False


Handler = Callable[[HttpRequest], Awaitable[Any]]
ErrorBody = Callable[[int, str], Any]


def default_error_body(_status: int, message: str) -> Any:
    return {"error": message}


class HttpServer:
    def __init__(self, *, registry: CollectorRegistry | None = None, token: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, error_body: ErrorBody = default_error_body,
                 keep_alive: bool = False, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 now_ns: Callable[[], int] = time.monotonic_ns):
        """`keep_alive`: persistent connections (module docstring), each closed after `idle_timeout_s` idle.
        `now_ns`: the clock requests' `arrived_ns` is read on (a monotonic one unless the caller's differs)."""
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s!r}")
        self._routes: dict[str, dict[str, tuple[Handler, bool]]] = {}
        self._watched: set[tuple[str, str]] = set()  # (METHOD, path) cancelled when their client goes away
        self._token = token
        self.max_body_bytes = max_body_bytes
        self._error_body = error_body
        self.keep_alive = keep_alive
        self.idle_timeout_s = idle_timeout_s
        self._now_ns = now_ns
        self._server: asyncio.AbstractServer | None = None
        # Connections waiting for their next request, and the tasks serving them (close() ends them).
        self._idle: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}
        self._closing = False
        self.host = ""
        self.port = 0
        if registry is not None:
            async def metrics(_: HttpRequest) -> HttpResponse:
                return HttpResponse(200, generate_latest(registry), CONTENT_TYPE_LATEST)

            self.route("GET", "/metrics", metrics, public=True)

    def route(self, method: str, path: str, handler: Handler, *, public: bool = False,
              cancel_on_disconnect: bool = False) -> None:
        """Register `handler` for METHOD path. It returns a JSON-able value (200), an HttpResponse or an
        HttpStream. A path ending in "/" (e.g. "/faults/") also serves every path below it ("/faults/NAME"):
        the handler reads the rest from `request.path`. `cancel_on_disconnect`: a client that closes the
        connection before the answer is complete cancels the handler (and its stream)."""
        if not path.startswith("/"):
            raise ValueError(f"route path must start with '/', got {path!r}")
        methods = self._routes.setdefault(path, {})
        if method.upper() in methods:
            raise ValueError(f"route {method.upper()} {path} is already registered")
        methods[method.upper()] = (handler, public)
        if cancel_on_disconnect:
            self._watched.add((method.upper(), path))

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        try:
            self._server = await asyncio.start_server(self._serve_one, host, port, limit=MAX_HEAD_BYTES)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(exc.errno, f"HTTP port {port} on {host} is already in use "
                                         f"(choose another with --http-port)") from exc
            raise OSError(exc.errno, f"cannot listen for HTTP on {host}:{port}: {exc.strerror}") from exc
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    async def close(self) -> None:
        """Stop accepting; close the connections idle between requests (one mid-answer closes after it)."""
        self._closing = True
        idle = list(self._idle.items())
        for writer, _task in idle:
            writer.close()  # its handler reads the end of the stream and returns
        if idle:
            await asyncio.wait([task for _writer, task in idle], timeout=CLOSE_WAIT_S)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> HttpServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- one connection -------------------------------------------------------------------------

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer the connection's requests in order until one does not keep it (or the client leaves)."""
        incoming = IncomingBytes(reader, self._now_ns)
        wait_s = HEAD_TIMEOUT_S  # for the first request; then the idle timeout between requests
        try:
            while True:
                task = asyncio.current_task()
                if task is not None:
                    self._idle[writer] = task
                try:
                    if self._closing:
                        return  # the server is stopping
                    async with asyncio.timeout(wait_s):
                        if not await incoming.next_request_begins():
                            return  # the client closed the connection
                finally:
                    self._idle.pop(writer, None)
                wait_s = self.idle_timeout_s
                if not await self._serve_request(incoming, writer):
                    return
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ClientGone):
            pass  # silent or gone: nothing to answer
        finally:
            writer.close()

    async def _serve_request(self, incoming: IncomingBytes, writer: asyncio.StreamWriter) -> bool:
        """Read, dispatch and answer the request whose first byte is in; True if the connection stays open."""
        try:
            request = await self._read_request(incoming, writer)
        except HttpError as exc:  # the stream is out of step with its requests from here: answer and close
            await self._write(writer, HttpResponse.json(self._error_body(exc.status, exc.message), exc.status),
                              persist=False, version="HTTP/1.1")
            return False
        persist = self._persists(request)
        try:
            response = await self._dispatch(request, incoming)
        except HttpError as exc:  # the request was read whole: the connection is still in step
            response = HttpResponse.json(self._error_body(exc.status, exc.message), exc.status)
        persist = persist and not self._closing
        if isinstance(response, HttpStream):
            if request.version == "HTTP/1.0":
                persist = False  # its body ends at the close: HTTP/1.0 has no chunked encoding
            await self._write_stream(writer, response, incoming if response.cancel_on_disconnect else None,
                                     persist=persist, version=request.version,
                                     keep_at_most=MAX_HEAD_BYTES + self.max_body_bytes)
        else:
            await self._write(writer, response, persist=persist, version=request.version)
        return persist

    def _persists(self, request: HttpRequest) -> bool:
        """Whether the connection stays open after this request's answer (RFC 9112 §9.3)."""
        if not self.keep_alive:
            return False
        options = {option.strip().lower() for option in request.headers.get("connection", "").split(",")}
        if request.version == "HTTP/1.0":
            return "keep-alive" in options
        return "close" not in options

    async def _read_request(self, incoming: IncomingBytes, writer: asyncio.StreamWriter) -> HttpRequest:
        arrived_ns = incoming.next_byte_arrived_ns()
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            method, target, version, headers = await self._read_head(incoming)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise HttpError(411, "chunked bodies are not supported: send Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            raise HttpError(400, f"bad Content-Length {headers.get('content-length')!r}") from None
        if length > self.max_body_bytes:
            raise HttpError(413, f"request body of {length} bytes is over the {self.max_body_bytes}-byte limit")
        if length and headers.get("expect", "").lower() == "100-continue":
            # curl asks before sending a body over 1 KiB and waits a second for the answer: do not make it wait.
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        try:  # a client that announces a body and never sends it is dropped like one that sends no head
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                body = await incoming.read_exactly(length) if length else b""
        except TimeoutError:
            raise HttpError(408, f"request body of {length} bytes did not arrive within "
                                 f"{HEAD_TIMEOUT_S:.0f} s") from None
        url = urlsplit(target)
        return HttpRequest(method.upper(), url.path, parse_qs(url.query), headers, body, version, arrived_ns)

    @staticmethod
    async def _read_head(incoming: IncomingBytes) -> tuple[str, str, str, dict[str, str]]:
        """The request line and the headers (lower-case names), within MAX_HEAD_BYTES in all."""
        try:
            return await HttpServer._read_head_lines(incoming)
        except HeadTooLong:
            raise HttpError(431, f"request head over {MAX_HEAD_BYTES} bytes") from None

    @staticmethod
    async def _read_head_lines(incoming: IncomingBytes) -> tuple[str, str, str, dict[str, str]]:
        budget = MAX_HEAD_BYTES
        request_line = (await incoming.read_line(budget)).decode("latin-1")
        budget -= len(request_line) + 2
        if budget < 0:
            raise HttpError(431, f"request head over {MAX_HEAD_BYTES} bytes")
        try:
            method, target, version = request_line.split(" ")
        except ValueError:
            raise HttpError(400, f"malformed request line {request_line[:100]!r}") from None
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise HttpError(505, f"unsupported protocol {version[:20]!r} (HTTP/1.x only)")
        headers: dict[str, str] = {}
        while line := (await incoming.read_line(budget)).decode("latin-1"):
            budget -= len(line) + 2
            if budget < 0:
                raise HttpError(431, f"request head over {MAX_HEAD_BYTES} bytes")
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpError(400, f"malformed header line {line[:100]!r}")
            headers[name.strip().lower()] = value.strip()
        return method, target, version, headers

    async def _dispatch(self, request: HttpRequest, incoming: IncomingBytes | None = None) -> HttpResponse | HttpStream:
        methods = self._routes.get(request.path)
        if methods is None:
            methods = self._subtree_routes(request.path)
        if methods is None:
            raise HttpError(404, f"no route {request.path}")
        entry = methods.get(request.method)
        if entry is None:
            response = HttpResponse.json(self._error_body(
                405, f"{request.method} not allowed on {request.path} (allowed: {', '.join(sorted(methods))})"), 405)
            response.headers["Allow"] = ", ".join(sorted(methods))
            return response
        handler, public = entry
        if self._token is not None and not public:
            auth = request.headers.get("authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), self._token.encode()):
                response = HttpResponse.json(self._error_body(401, "missing or wrong bearer token"), 401)
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
        watched = incoming is not None and self._is_watched(request)
        try:
            if watched:
                assert incoming is not None  # narrowed for mypy: `watched` implies it
                result = await unless_client_leaves(incoming, handler(request), MAX_HEAD_BYTES + self.max_body_bytes)
            else:
                result = await handler(request)
        except (HttpError, ClientGone):
            raise
        except ValueError as exc:  # ConfigError, ShapingError: the caller's value was wrong
            raise HttpError(400, str(exc)) from None
        except Exception:
            log.exception("HTTP handler %s %s failed", request.method, request.path)
            raise HttpError(500, f"internal error handling {request.method} {request.path}") from None
        if isinstance(result, HttpStream):
            result.cancel_on_disconnect = result.cancel_on_disconnect or watched
            return result
        return result if isinstance(result, HttpResponse) else HttpResponse.json(result)

    def _is_watched(self, request: HttpRequest) -> bool:
        if (request.method, request.path) in self._watched:
            return True
        prefixes = [p for p in self._routes if p.endswith("/") and request.path.startswith(p)]
        return any((request.method, p) in self._watched for p in prefixes)

    def _subtree_routes(self, path: str) -> dict | None:
        """The routes of the longest registered "PREFIX/" that `path` lies below (None: no such prefix)."""
        prefixes = [p for p in self._routes if p.endswith("/") and path.startswith(p) and len(path) > len(p)]
        return self._routes[max(prefixes, key=len)] if prefixes else None

    @staticmethod
    def _connection_header(persist: bool, version: str) -> list[str]:
        """What the answer says of its connection: closing, or kept (said aloud only to HTTP/1.0, whose default
        is to close)."""
        if not persist:
            return ["Connection: close"]
        return ["Connection: keep-alive"] if version == "HTTP/1.0" else []

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: HttpResponse, *, persist: bool, version: str) -> None:
        try:
            reason = HTTPStatus(response.status).phrase
        except ValueError:  # a status code the standard library does not name
            reason = ""
        head = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
                f"Content-Length: {len(response.body)}", *HttpServer._connection_header(persist, version)]
        head += [f"{k}: {v}" for k, v in response.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body)
        await writer.drain()

    @staticmethod
    async def _write_stream(writer: asyncio.StreamWriter, stream: HttpStream, watch: IncomingBytes | None, *,
                            persist: bool, version: str, keep_at_most: int) -> None:
        """The head, then each chunk as it comes (chunked encoding; raw to HTTP/1.0, ended by the close), then the
        last chunk. With `watch`, a client that closes the connection meanwhile stops the stream (ClientGone)."""
        try:
            reason = HTTPStatus(stream.status).phrase
        except ValueError:
            reason = ""
        chunked = version != "HTTP/1.0"
        head = [f"HTTP/1.1 {stream.status} {reason}", f"Content-Type: {stream.content_type}",
                *(["Transfer-Encoding: chunked"] if chunked else []), "Cache-Control: no-cache",
                *HttpServer._connection_header(persist, version)]
        head += [f"{k}: {v}" for k, v in stream.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))

        async def pump() -> None:
            await writer.drain()
            async for chunk in stream.chunks:
                if chunk:  # an empty chunk would end the body
                    writer.write(f"{len(chunk):x}\r\n".encode("latin-1") + chunk + b"\r\n" if chunked else chunk)
                    await writer.drain()
            if chunked:
                writer.write(b"0\r\n\r\n")
                await writer.drain()

        try:
            await (unless_client_leaves(watch, pump(), keep_at_most) if watch is not None else pump())
        finally:
            await stream.chunks.aclose()  # a generator left mid-way runs its cleanup now (the client is gone)
