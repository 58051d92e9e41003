"""The tiny HTTP server: /metrics, JSON control routes, and every error a client can provoke."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import CollectorRegistry, Counter

from kvtransit.runtime.http import HttpError, HttpServer


async def request(server, method, path, body=b"", headers=()):
    reader, writer = await asyncio.open_connection(server.host, server.port)
    head = [f"{method} {path} HTTP/1.1", f"Host: {server.host}", f"Content-Length: {len(body)}", *headers]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    head_block, _, payload = rest.partition(b"\r\n\r\n")
    response_headers = dict(line.split(": ", 1) for line in head_block.decode().split("\r\n"))
    return int(status_line.split()[1]), response_headers, payload


@pytest.fixture
async def server():
    registry = CollectorRegistry()
    Counter("hits", "test counter", namespace="kvtransit", registry=registry).inc(3)
    http = HttpServer(registry=registry, token=None, max_body_bytes=1000)
    state = {"rate": 1.0}

    async def get_rate(_):
        return state

    async def set_rate(req):
        body = req.json()
        if not isinstance(body, dict) or "rate" not in body:
            raise HttpError(400, "body must be an object with 'rate'")
        if body["rate"] <= 0:
            raise ValueError(f"rate must be > 0, got {body['rate']!r}")
        state["rate"] = body["rate"]
        return state

    http.route("GET", "/link", get_rate)
    http.route("POST", "/link", set_rate)
    await http.start()
    yield http
    await http.close()


async def test_metrics_serves_the_given_registry(server):
    status, headers, body = await request(server, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert b"kvtransit_hits_total 3.0" in body


async def test_a_control_route_takes_and_returns_json(server):
    status, _, body = await request(server, "POST", "/link", json.dumps({"rate": 2.5}).encode())
    assert (status, json.loads(body)) == (200, {"rate": 2.5})
    status, _, body = await request(server, "GET", "/link")
    assert json.loads(body) == {"rate": 2.5}


@pytest.mark.parametrize("method,path,body,status,message", [
    ("POST", "/link", b"{rate: 2", 400, "not valid JSON"),
    ("POST", "/link", b"[1]", 400, "object with 'rate'"),
    ("POST", "/link", b'{"rate": -1}', 400, "rate must be > 0"),
    ("GET", "/nope", b"", 404, "no route /nope"),
    ("DELETE", "/link", b"", 405, "allowed: GET, POST"),
    ("POST", "/link", b"x" * 1001, 413, "over the 1000-byte limit"),
])
async def test_bad_requests_get_a_status_and_a_message(server, method, path, body, status, message):
    got_status, _, payload = await request(server, method, path, body)
    assert got_status == status
    assert message in json.loads(payload)["error"]


async def test_a_token_guards_control_routes_but_not_metrics():
    http = HttpServer(registry=CollectorRegistry(), token="s3cret")

    async def ok(_):
        return {"ok": True}

    http.route("GET", "/state", ok)
    await http.start()
    try:
        assert (await request(http, "GET", "/state"))[0] == 401
        assert (await request(http, "GET", "/state", headers=["Authorization: Bearer wrong"]))[0] == 401
        assert (await request(http, "GET", "/state", headers=["Authorization: Bearer s3cret"]))[0] == 200
        assert (await request(http, "GET", "/metrics"))[0] == 200
    finally:
        await http.close()


async def test_binds_loopback_by_default_and_names_a_port_in_use(server):
    assert server.host == "127.0.0.1"
    other = HttpServer()
    with pytest.raises(OSError, match=f"HTTP port {server.port} on 127.0.0.1 is already in use"):
        await other.start(port=server.port)
