"""A tiny asyncio HTTP/1.1 server: `/metrics` for Prometheus and JSON control routes (toxiproxy's api.go).

No dependency beyond the stdlib and prometheus_client. One request per connection (`Connection: close`):
scrapes and control calls are rare, so keep-alive is not worth its state. Binds 127.0.0.1 by default; an
optional bearer token guards every route not registered `public=True`.

    http = HttpServer(registry=registry, token=None)
    http.route("POST", "/link/rate", set_rate)     # async def set_rate(request) -> JSON-able | HttpResponse
    await http.start(port=9100)
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
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


Handler = Callable[[HttpRequest], Awaitable[Any]]


class HttpServer:
    def __init__(self, *, registry: CollectorRegistry | None = None, token: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self._routes: dict[str, dict[str, tuple[Handler, bool]]] = {}
        self._token = token
        self.max_body_bytes = max_body_bytes
        self._server: asyncio.AbstractServer | None = None
        self.host = ""
        self.port = 0
        if registry is not None:
            async def metrics(_: HttpRequest) -> HttpResponse:
                return HttpResponse(200, generate_latest(registry), CONTENT_TYPE_LATEST)

            self.route("GET", "/metrics", metrics, public=True)

    def route(self, method: str, path: str, handler: Handler, *, public: bool = False) -> None:
        """Register `handler` for METHOD path. It returns a JSON-able value (200) or an HttpResponse.
        A path ending in "/" (e.g. "/faults/") also serves every path below it ("/faults/NAME"): the handler
        reads the rest from `request.path`."""
        if not path.startswith("/"):
            raise ValueError(f"route path must start with '/', got {path!r}")
        methods = self._routes.setdefault(path, {})
        if method.upper() in methods:
            raise ValueError(f"route {method.upper()} {path} is already registered")
        methods[method.upper()] = (handler, public)

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
                response = HttpResponse.json({"error": exc.message}, exc.status)
            await self._write(writer, response)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _respond(self, reader: asyncio.StreamReader) -> HttpResponse:
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
        return await self._dispatch(request)

    async def _dispatch(self, request: HttpRequest) -> HttpResponse:
        methods = self._routes.get(request.path)
        if methods is None:
            methods = self._subtree_routes(request.path)
        if methods is None:
            raise HttpError(404, f"no route {request.path}")
        entry = methods.get(request.method)
        if entry is None:
            response = HttpResponse.json(
                {"error": f"{request.method} not allowed on {request.path} (allowed: {', '.join(sorted(methods))})"},
                405)
            response.headers["Allow"] = ", ".join(sorted(methods))
            return response
        handler, public = entry
        if self._token is not None and not public:
            auth = request.headers.get("authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), self._token.encode()):
                response = HttpResponse.json({"error": "missing or wrong bearer token"}, 401)
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
        try:
            result = await handler(request)
        except HttpError:
            raise
        except ValueError as exc:  # ConfigError, ShapingError: the caller's value was wrong
            raise HttpError(400, str(exc)) from None
        except Exception:
            log.exception("HTTP handler %s %s failed", request.method, request.path)
            raise HttpError(500, f"internal error handling {request.method} {request.path}") from None
        return result if isinstance(result, HttpResponse) else HttpResponse.json(result)

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
