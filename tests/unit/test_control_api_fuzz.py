"""Fuzz the middlebox's control API over real loopback HTTP: no input crashes it (no 500), hangs it, or leaves it
unable to serve; every refusal is a 4xx/5xx the client can read. Example count: tests/unit/_fuzz.py (10,000 per
property when CI=true)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.control import register_control_routes
from kvtransit.agents.middlebox.faults import FAULT_TYPES, MAX_FAULTS
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.http import HttpServer

from ._fuzz import fuzz_settings

FUZZ = fuzz_settings()
# What a refusal may be: bad request, unauthorised, not found, method, body timeout, length required, too
# large, head too large, version. Never 500 (that would be a crash the handler did not foresee).
REFUSALS = {400, 401, 404, 405, 408, 411, 413, 431, 505}
ANSWER_TIMEOUT_S = 5.0  # far above a loopback round trip; a hang fails the example


class LiveControlApi:
    """A real Middlebox (no decode connected: nothing flows) behind its real control routes, on loopback."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.middlebox = self.loop.run_until_complete(self._start())

    async def _start(self) -> Middlebox:
        middlebox = Middlebox(Scenario(codec="none"), [("127.0.0.1", 9)])
        self.http = HttpServer()
        register_control_routes(self.http, middlebox)
        await self.http.start("127.0.0.1", 0)
        return middlebox

    def raw(self, data: bytes) -> bytes:
        return self.loop.run_until_complete(asyncio.wait_for(self._raw(data), ANSWER_TIMEOUT_S))

    async def _raw(self, data: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(self.http.host, self.http.port)
        try:
            writer.write(data)
            writer.write_eof()  # a request cut short must be answered or dropped, never waited on
            await writer.drain()
            return await reader.read()
        except ConnectionError:
            return b""
        finally:
            writer.close()

    def call(self, method: str, path: str, body: bytes) -> int:
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode("latin-1")
        answer = self.raw(head + body)
        return status_of(answer)

    def close(self) -> None:
        self.loop.run_until_complete(self.http.close())
        self.loop.run_until_complete(self.middlebox.close())
        self.loop.close()


def status_of(answer: bytes) -> int:
    line = answer.split(b"\r\n", 1)[0].split(b" ")
    assert line[0] == b"HTTP/1.1" and len(line) > 1 and line[1].isdigit(), f"not an HTTP answer: {answer[:80]!r}"
    return int(line[1])


@pytest.fixture(scope="module")
def api():
    live = LiveControlApi()
    yield live
    live.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)
field_names = st.sampled_from(["codec", "keep", "block", "sinks", "variant", "precision_bits", "rate_Bps",
                               "latency_s", "jitter_s", "type", "probability", "seed", "after_bytes", "bytes",
                               "timeout_s", "latency_s", "average_bytes", "delay_s"]) | st.text(max_size=8)
field_values = json_values | st.sampled_from(["none", "fp8", "freq-keep-k", "fp4-block", "dct", "fft",
                                              *FAULT_TYPES]) | st.floats(-1e9, 1e9)
bodies = (st.dictionaries(field_names, field_values, max_size=5).map(lambda d: json.dumps(d).encode())
          | json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=64))
paths = st.sampled_from(["/kernel", "/link", "/chain", "/stats", "/faults", "/faults/", "/metrics"]) | \
    st.builds(lambda name: f"/faults/{name}", st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=70))


@FUZZ
@given(method=st.sampled_from(["GET", "PUT", "DELETE", "POST", "PATCH"]), path=paths, body=bodies)
def test_control_calls_are_answered_and_never_crash_the_api(api, method, path, body):
    status = api.call(method, path.replace(" ", "%20"), body)
    assert status == 200 or status in REFUSALS, status
    assert len(api.middlebox.faults.describe()) <= MAX_FAULTS


@FUZZ
@given(st.binary(max_size=512))
def test_raw_bytes_get_an_http_refusal_or_a_closed_connection(api, data):
    answer = api.raw(data)
    if answer:
        assert status_of(answer) in REFUSALS | {200}


def test_an_unknown_link_field_is_a_400_naming_it_and_the_valid_fields(api):
    before = api.middlebox.describe_chain()
    body = json.dumps({"latency_s": 0.5, "bogus": 1}).encode()
    head = f"PUT /link HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode("latin-1")
    answer = api.raw(head + body)
    assert status_of(answer) == 400
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {
        "error": "unknown link field 'bogus' (fields: rate_Bps, latency_s, jitter_s)"}
    assert api.middlebox.describe_chain() == before  # refused as a whole


def test_the_api_still_serves_after_the_fuzzing(api):
    assert api.call("GET", "/chain", b"") == 200
    api.middlebox.faults.clear()
    assert api.call("PUT", "/faults/probe", json.dumps({"type": "latency", "latency_s": 0.01}).encode()) == 200
    assert api.call("DELETE", "/faults/probe", b"") == 200
