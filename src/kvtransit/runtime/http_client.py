"""The one HTTP client: a single request to a local agent's HTTP side (`/stats`, the middlebox's control API).

The peers are our own `runtime/http.py` servers: one request per connection (`Connection: close`), a
Content-Length on every body, so the answer is everything read until the server closes. No keep-alive, no
redirects, no chunked bodies: the load generator, the launcher and chaos make a few calls a run, on loopback.

    answer = await request(host, port, "PUT", "/faults/x", json_body({"type": "latency"}))
    stats = await get_json(host, port, "/stats")          # raises HttpStatusError unless 200
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Connecting and reading the whole answer each get this long: a local agent answers /stats in milliseconds;
# one that takes 5 s is stuck, and a run report must not wait on it.
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HttpAnswer:
    status: int  # 0 when the status line could not be read
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class HttpStatusError(ConnectionError):
    """The server answered, but not 200 (a ConnectionError: to a caller, the agent did not give its figures)."""

    def __init__(self, method: str, url: str, status: int, body: bytes):
        super().__init__(f"{method} {url} answered {status or '?'}")
        self.status, self.body = status, body


def json_body(value: Any) -> bytes:
    return json.dumps(value).encode()


async def request(host: str, port: int, method: str, path: str, body: bytes | None = None, *,
                  headers: Mapping[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> HttpAnswer:
    """One HTTP/1.1 request; the answer whatever its status. Connection failures raise OSError/ConnectionError,
    a server too slow to connect or answer raises asyncio.TimeoutError."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
    try:
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close",
                f"Content-Length: {len(body or b'')}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
        await writer.drain()
        async with asyncio.timeout(timeout_s):
            raw = await reader.read()
    finally:
        writer.close()
    return parse_answer(raw)


def parse_answer(raw: bytes) -> HttpAnswer:
    """The status and body of a whole `Connection: close` answer."""
    status_line, _, rest = raw.partition(b"\r\n")
    parts = status_line.split(b" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return HttpAnswer(status, rest.partition(b"\r\n\r\n")[2])


async def get_json(host: str, port: int, path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """GET a JSON route (an agent's /stats); anything but 200 raises HttpStatusError, bad JSON ValueError."""
    answer = await request(host, port, "GET", path, timeout_s=timeout_s)
    if answer.status != 200:
        raise HttpStatusError("GET", f"http://{host}:{port}{path}", answer.status, answer.body)
    return answer.json()
