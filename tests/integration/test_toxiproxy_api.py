"""toxiproxy's own Python client drives the middlebox's toxiproxy API, and the link feels it.

A live Middlebox between a prefill stub and a decode stub (test_middlebox's), its control server with the
toxiproxy routes, and `toxiproxy-python` (a published client of toxiproxy 2.x's API) pointed at it. The hand-off
is timed at the decode stub: KvBegin sent → KvEnd received.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from kvtransit.agents.middlebox.toxiproxy_api import KV_PROXY, register_toxiproxy_routes
from kvtransit.runtime.http import HttpServer

from .test_middlebox import DecodeStub, known_kv, next_acks, prefill_client, send_kv, testbed  # noqa: F401

toxiproxy = pytest.importorskip("toxiproxy", reason="toxiproxy-python (the test extra) is not installed")


class TimedDecode(DecodeStub):
    """The decode stub, noting when each KvEnd arrived."""

    def __init__(self):
        super().__init__()
        self.end_ns: dict[int, int] = {}

    async def handle(self, endpoint):
        original = endpoint.next_event

        async def next_event():
            event = await original()
            if event is not None and type(event).__name__ == "KvEnd":
                self.end_ns[event.request_id] = time.monotonic_ns()
            return event

        endpoint.next_event = next_event
        await super().handle(endpoint)


@pytest.fixture
async def toxic_link(testbed, monkeypatch):  # noqa: F811 — the fixture imported above
    import tests.integration.test_middlebox as harness

    monkeypatch.setattr(harness, "DecodeStub", TimedDecode)
    stub, mb, server, _ = await testbed(codec="none")  # pass-through: no kernel time to overlap the delay
    http = HttpServer()
    register_toxiproxy_routes(http, mb, listen=f"127.0.0.1:{server.port}")
    await http.start("127.0.0.1", 0)
    client = toxiproxy.Toxiproxy()
    client.update_api_consumer("127.0.0.1", http.port)
    prefill = await prefill_client(server.port)
    next_id = iter(range(1000))

    async def handoff_s(idle_before_s: float = 0.020) -> float:
        """The shortest of five hand-offs, first token → KvEnd at decode (a busy box only ever adds to one).
        The first token is stamped `idle_before_s` ahead, as the prefill stamps its step's end, so the middlebox
        holds the KV until then (app.py, _transfer) and the time it took to arrive is not part of the hand-off, with
        or without a toxic."""
        took = []
        for _ in range(5):
            rid = next(next_id)
            first_token_ns = time.monotonic_ns() + round(idle_before_s * 1e9)
            await send_kv(prefill, rid, known_kv(rid), first_token_ns=first_token_ns)
            await next_acks(prefill, 1)
            took.append((stub.end_ns[rid] - first_token_ns) / 1e9)
        return min(took)

    yield client, handoff_s, mb, server.port
    await prefill.aclose()
    await http.close()


async def test_a_latency_toxic_delays_the_handoff_by_its_latency_and_removing_it_restores_it(toxic_link):
    client, handoff_s, mb, _ = toxic_link
    proxy = await asyncio.to_thread(client.get_proxy, KV_PROXY)
    assert proxy is not None and proxy.enabled
    # Each hand-off's bytes leave the middlebox after the same 70 ms of idle, with or without the toxic (its first
    # token 70 ms ahead, or 20 ms ahead + the toxic's 50 ms): this VM runs slowly for a moment after a long idle
    # (measured: the first write after a 50 ms hold took up to 1.1 ms, after a 20 ms one 0.04–0.3 ms), which would
    # otherwise be charged to the toxic. What is compared is only what the toxic adds.
    before = await handoff_s(idle_before_s=0.070)
    await asyncio.to_thread(proxy.add_toxic, type="latency", stream="upstream", name="slow",
                            attributes={"latency": 50})
    toxics = await asyncio.to_thread(proxy.toxics)
    assert list(toxics) == ["slow"] and toxics["slow"].attributes == {"latency": 50, "jitter": 0}
    delayed = await handoff_s(idle_before_s=0.020)
    assert delayed - before == pytest.approx(0.050, abs=0.002)
    await asyncio.to_thread(proxy.destroy_toxic, "slow")
    assert await handoff_s(idle_before_s=0.070) == pytest.approx(before, abs=0.002)
    assert mb.chain.link.fault_latency_s == 0.0


async def test_reset_clears_every_toxic_and_fault_and_the_version_answers(toxic_link):
    client, _, mb, _ = toxic_link
    proxy = await asyncio.to_thread(client.get_proxy, KV_PROXY)
    await asyncio.to_thread(proxy.add_toxic, type="latency", stream="upstream", attributes={"latency": 20})
    await asyncio.to_thread(proxy.add_toxic, type="bandwidth", stream="upstream", attributes={"rate": 50_000})
    assert [f["name"] for f in mb.faults.describe()] == ["toxiproxy.kv.bandwidth_upstream"]
    assert await asyncio.to_thread(client.reset)
    assert await asyncio.to_thread(proxy.toxics) == {}
    assert mb.faults.describe() == [] and mb.chain.link.fault_latency_s == 0.0
    version = await asyncio.to_thread(client.version)
    assert b"2.12.0" in version


async def test_the_client_sees_toxiproxys_errors_for_bad_toxics_and_unknown_names(toxic_link):
    from toxiproxy.exceptions import InvalidToxic, NotFound

    client, _, _, _ = toxic_link
    proxy = await asyncio.to_thread(client.get_proxy, KV_PROXY)
    with pytest.raises(InvalidToxic, match=r"use stream .+upstream"):
        await asyncio.to_thread(proxy.add_toxic, type="latency", attributes={"latency": 5})  # the default stream
    with pytest.raises(InvalidToxic, match=r"invalid toxic type .+jam"):
        await asyncio.to_thread(proxy.add_toxic, type="jam", stream="upstream")
    with pytest.raises(NotFound):
        await asyncio.to_thread(proxy.destroy_toxic, "no-such-toxic")
    assert await asyncio.to_thread(client.get_proxy, "mysql") is None


async def test_disabling_the_proxy_takes_the_link_down_until_it_is_enabled(toxic_link):
    from kvtransit.wire.events import Ack, Error

    client, handoff_s, mb, port = toxic_link
    proxy = await asyncio.to_thread(client.get_proxy, KV_PROXY)
    await handoff_s()  # the link works
    await asyncio.to_thread(proxy.disable)
    assert (await asyncio.to_thread(client.get_proxy, KV_PROXY)).enabled is False
    assert [f["type"] for f in mb.faults.describe()] == ["reset_peer"]
    prefill = await prefill_client(port)
    await send_kv(prefill, 900, known_kv(900))
    answer = await asyncio.wait_for(prefill.next_event(), 10)
    assert isinstance(answer, Error) and answer.request_id == 900 and "reset" in answer.message
    await asyncio.to_thread(proxy.enable)
    assert mb.faults.describe() == []
    for attempt in range(50):  # the middlebox dials decode again after the reset
        await send_kv(prefill, 901 + attempt, known_kv(1))
        answer = await asyncio.wait_for(prefill.next_event(), 10)
        if isinstance(answer, Ack):
            break
        await asyncio.sleep(0.1)
    assert isinstance(answer, Ack), answer
    await prefill.aclose()
