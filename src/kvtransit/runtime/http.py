"""A tiny asyncio HTTP/1.1 server: `/metrics` for Prometheus and JSON control routes (toxiproxy's api.go).

No dependency beyond the stdlib and prometheus_client. One request per connection (`Connection: close`):
scrapes and control calls are rare, so keep-alive is not worth its state. Binds 127.0.0.1 by default; an
optional bearer token guards every route not registered `public=True`.

    http = HttpServer(registry=registry, token=None)
    http.route("POST", "/link/rate", set_rate)     # async def set_rate(request) -> JSON-able | HttpResponse
    await http.start(port=9100)

Long answers (the OpenAI front end, agents/frontend/): a handler may return an `HttpStream`, whose chunks are
sent as they come (chunked transfer encoding: server-sent events need no Content-Length up front). A route
registered `cancel_on_disconnect=True` has its handler, and the stream it returns, cancelled when the client
closes its side of the connection, so the work behind an abandoned request stops (the handler sees
CancelledError). `error_body(status, message)` shapes every error the server itself answers (404, 405, bad
head, ...) for APIs with their own error shape; by default {"error": message}.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# Control bodies are a few small JSON fields; 1 MiB is far above any real one and bounds a bad client.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Request line + headers; anything larger is not a control call.
MAX_HEAD_BYTES = 16 * 1024
# A client that connects and says nothing is dropped after this.
HEAD_TIMEOUT_S = 10.0


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


class ClientGone(Exception):
    """The client closed the connection before its answer was complete."""


class HttpServer:
    def __init__(self, *, registry: CollectorRegistry | None = None, token: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, error_body: ErrorBody = default_error_body):
        self._routes: dict[str, dict[str, tuple[Handler, bool]]] = {}
        self._watched: set[tuple[str, str]] = set()  # (METHOD, path) cancelled when their client goes away
        self._token = token
        self.max_body_bytes = max_body_bytes
        self._error_body = error_body
        self._server: asyncio.AbstractServer | None = None
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
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> HttpServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- one connection -------------------------------------------------------------------------

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                response = await self._respond(reader)
            except HttpError as exc:
                response = HttpResponse.json(self._error_body(exc.status, exc.message), exc.status)
            if isinstance(response, HttpStream):
                await self._write_stream(writer, response, reader if response.cancel_on_disconnect else None)
            else:
                await self._write(writer, response)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ClientGone):
            pass
        finally:
            writer.close()

    async def _respond(self, reader: asyncio.StreamReader) -> HttpResponse | HttpStream:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            raise HttpError(431, f"request head over {MAX_HEAD_BYTES} bytes") from None
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            raise HttpError(400, f"malformed request line {lines[0][:100]!r}") from None
        if not version.startswith("HTTP/1."):
            raise HttpError(505, f"unsupported protocol {version[:20]!r} (HTTP/1.x only)")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, sep, value = line.partition(":")
                if not sep:
                    raise HttpError(400, f"malformed header line {line[:100]!r}")
                headers[name.strip().lower()] = value.strip()
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
        try:  # a client that announces a body and never sends it is dropped like one that sends no head
            body = await asyncio.wait_for(reader.readexactly(length), HEAD_TIMEOUT_S) if length else b""
        except TimeoutError:
            raise HttpError(408, f"request body of {length} bytes did not arrive within "
                                 f"{HEAD_TIMEOUT_S:.0f} s") from None
        url = urlsplit(target)
        request = HttpRequest(method.upper(), url.path, parse_qs(url.query), headers, body)
        return await self._dispatch(request, reader)

    async def _dispatch(self, request: HttpRequest,
                        reader: asyncio.StreamReader | None = None) -> HttpResponse | HttpStream:
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
        watched = reader is not None and self._is_watched(request)
        try:
            if watched:
                assert reader is not None  # narrowed for mypy: `watched` implies it
                result = await _unless_client_leaves(reader, handler(request))
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
    async def _write(writer: asyncio.StreamWriter, response: HttpResponse) -> None:
        try:
            reason = HTTPStatus(response.status).phrase
        except ValueError:  # a status code the standard library does not name
            reason = ""
        head = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
                f"Content-Length: {len(response.body)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in response.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body)
        await writer.drain()

    @staticmethod
    async def _write_stream(writer: asyncio.StreamWriter, stream: HttpStream,
                            watch: asyncio.StreamReader | None) -> None:
        """The head, then each chunk as it comes (chunked encoding), then the last chunk. With `watch`, a client
        that closes the connection meanwhile stops the stream (ClientGone)."""
        try:
            reason = HTTPStatus(stream.status).phrase
        except ValueError:
            reason = ""
        head = [f"HTTP/1.1 {stream.status} {reason}", f"Content-Type: {stream.content_type}",
                "Transfer-Encoding: chunked", "Cache-Control: no-cache", "Connection: close"]
        head += [f"{k}: {v}" for k, v in stream.headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))

        async def pump() -> None:
            await writer.drain()
            async for chunk in stream.chunks:
                if chunk:  # an empty chunk would end the body
                    writer.write(f"{len(chunk):x}\r\n".encode("latin-1") + chunk + b"\r\n")
                    await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

        try:
            await (_unless_client_leaves(watch, pump()) if watch is not None else pump())
        finally:
            await stream.chunks.aclose()  # a generator left mid-way runs its cleanup now (the client is gone)


async def _client_left(reader: asyncio.StreamReader) -> None:
    """Return when the client closed its side (EOF) or reset the connection; bytes it sends meanwhile (a
    pipelined request we will not serve: one request per connection) are read and dropped."""
    try:
        while await reader.read(64 * 1024):
            pass
    except ConnectionError:
        pass


async def _unless_client_leaves(reader: asyncio.StreamReader, work: Awaitable[Any]) -> Any:
    """`work`'s result, or ClientGone (with `work` cancelled and awaited) if the client leaves first."""
    task = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_client_left(reader))
    try:
        await asyncio.wait([task, left], return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when we are cancelled ourselves (the server stopping): neither task outlives this call
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        left.cancel()
        await asyncio.gather(left, return_exceptions=True)
    if task.cancelled():
        raise ClientGone("the client closed the connection")
    return task.result()
