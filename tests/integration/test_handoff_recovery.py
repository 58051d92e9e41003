"""Hand-off recovery at decode, on real loopback sockets: a retried hand-off is dropped and acked again (never
decoded twice), and a stream that breaks mid-way is dropped without failing the request (its sender holds the
KV and retries; the outcome is the sender's to decide)."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvtransit.agents.decode.agent import DecodeAgent
from kvtransit.agents.process import Address, parse_ready_line
from kvtransit.agents.skeleton import serve
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.transport import open_endpoint
from kvtransit.wire.events import Ack, AckStatus, Error, Hello, Role, Tokens
from tests.unit._wire_samples import kv_stream

pytestmark = pytest.mark.timeout(60)
ANY = Address("127.0.0.1", 0)


async def start_decode(capsys) -> tuple[DecodeAgent, asyncio.Event, asyncio.Task, dict]:
    agent = DecodeAgent(Scenario(codec="none"), name="decode-0", listen=ANY, client_listen=ANY, metrics_listen=ANY,
                        accuracy_sample=0)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(agent, stop))
    while True:
        await asyncio.sleep(0.01)
        lines = [parse_ready_line(line) for line in capsys.readouterr().out.splitlines()]
        ready = next((info for info in lines if info), None)
        if ready:
            return agent, stop, task, ready


async def connect(port: int, our: Role):
    endpoint = await open_endpoint("127.0.0.1", port, our, Role.DECODE)
    await endpoint.send(Hello(our, 1, f"{our.name.lower()}-test"))
    assert isinstance(await endpoint.next_event(), Hello)
    return endpoint


async def send_kv(link, request_id: int, *, complete: bool = True) -> None:
    events = kv_stream(request_id)
    for event in events if complete else events[:2]:
        await link.send(event)
    if complete:
        await link.send(link.connection.kv_end(request_id))


async def ready_entries(client, request_id: int, wait_s: float = 0.5) -> int:
    """How many "KV ready" entries (token index 0) for the request reach the client within wait_s."""
    seen = 0
    try:
        while True:
            event = await asyncio.wait_for(client.next_event(), wait_s)
            if isinstance(event, Tokens):
                seen += sum(1 for e in event.entries if e.request_id == request_id and e.token_index == 0)
            assert not isinstance(event, Error), f"decode failed the request to the client: {event}"
    except TimeoutError:
        return seen


async def test_a_retried_hand_off_is_acked_again_and_decoded_once(capsys):
    agent, stop, task, ready = await start_decode(capsys)
    try:
        client = await connect(ready["client_port"], Role.LOADGEN)
        first = await connect(ready["listen_port"], Role.MIDDLEBOX)
        await send_kv(first, 5)
        ack = await first.next_event()
        assert isinstance(ack, Ack) and ack.status == AckStatus.OK
        first.abort()  # the Ack's relay died with this link: the prefill will send the KV again
        retry = await connect(ready["listen_port"], Role.MIDDLEBOX)
        await send_kv(retry, 5)
        again = await retry.next_event()
        assert isinstance(again, Ack) and again.status == AckStatus.OK and again.detail == "duplicate"
        assert await ready_entries(client, 5) == 1
        assert agent.ingress.handoffs == {"taken": 1, "duplicate": 1, "aborted": 0}
        retry.abort()
        client.abort()
    finally:
        stop.set()
        await task


async def test_a_stream_broken_mid_way_is_dropped_without_failing_the_request(capsys):
    agent, stop, task, ready = await start_decode(capsys)
    try:
        client = await connect(ready["client_port"], Role.LOADGEN)
        link = await connect(ready["listen_port"], Role.MIDDLEBOX)
        await send_kv(link, 9, complete=False)
        link.abort()
        assert await ready_entries(client, 9) == 0  # no Error reached the client either (checked inside)
        assert agent.ingress.handoffs["aborted"] == 1 and agent.outcomes["failed"] == 0
        fresh = await connect(ready["listen_port"], Role.MIDDLEBOX)  # the sender's retry then gets through
        await send_kv(fresh, 9)
        assert (await fresh.next_event()).status == AckStatus.OK
        assert await ready_entries(client, 9) == 1
        fresh.abort()
        client.abort()
    finally:
        stop.set()
        await task
    assert json.dumps(agent.stats()["kv_handoffs"]) == json.dumps({"taken": 1, "duplicate": 0, "aborted": 1})
