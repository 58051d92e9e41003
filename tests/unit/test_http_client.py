"""The one HTTP client (runtime/http_client.py) against the project's own HTTP server: what the load generator,
the launcher and chaos rely on."""

from __future__ import annotations

import socket

import pytest

from kvtransit.runtime.http import HttpServer
from kvtransit.runtime.http_client import HttpStatusError, get_json, json_body, parse_answer, request


@pytest.fixture
async def server():
    http = HttpServer(token="s3cret")
    state: dict = {"faults": {}}

    async def stats(_request):
        return {"role": "decode", "steps": 3}

    async def put_fault(req):
        state["faults"]["x"] = req.json()
        return {"ok": True}

    async def delete_fault(_req):
        return {"deleted": state["faults"].pop("x", None) is not None}

    http.route("GET", "/stats", stats, public=True)
    http.route("PUT", "/faults/x", put_fault)
    http.route("DELETE", "/faults/x", delete_fault)
    await http.start()
    try:
        yield http, state
    finally:
        await http.close()


async def test_get_json_returns_the_decoded_body_of_a_200(server):
    http, _ = server
    assert await get_json(http.host, http.port, "/stats") == {"role": "decode", "steps": 3}


async def test_get_json_raises_a_connection_error_naming_the_route_and_status_when_not_200(server):
    http, _ = server
    with pytest.raises(HttpStatusError, match=r"GET http://127\.0\.0\.1:\d+/nothing answered 404") as caught:
        await get_json(http.host, http.port, "/nothing")
    assert isinstance(caught.value, ConnectionError) and caught.value.status == 404


async def test_put_and_delete_carry_a_json_body_and_headers_and_return_any_status(server):
    http, state = server
    body = json_body({"type": "latency", "latency_s": 0.02})
    assert (await request(http.host, http.port, "PUT", "/faults/x", body)).status == 401  # no token: not an error
    answer = await request(http.host, http.port, "PUT", "/faults/x", body, headers={"Authorization": "Bearer s3cret"})
    assert (answer.status, answer.json()) == (200, {"ok": True})
    assert state["faults"]["x"] == {"type": "latency", "latency_s": 0.02}
    answer = await request(http.host, http.port, "DELETE", "/faults/x", headers={"Authorization": "Bearer s3cret"})
    assert (answer.status, answer.json()) == (200, {"deleted": True})


async def test_a_port_nobody_listens_on_is_an_os_error():
    with socket.socket() as probe:  # a free port, closed again: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(OSError, match=r"(?i)connect|refused"):
        await get_json("127.0.0.1", port, "/stats", timeout_s=2.0)


def test_an_answer_without_a_readable_status_line_has_status_0():
    assert parse_answer(b"").status == 0
    assert parse_answer(b"garbage").status == 0
    answer = parse_answer(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 2\r\n\r\n{}")
    assert (answer.status, answer.body) == (413, b"{}")
