"""Decode withdraws a request whose client went away (the load generator's Error naming it): out of the batch with
its KV reservation freed and no more tokens; or, if its KV has not come yet, that KV dropped when it does, with a
FAILED Ack. ManualClock and in-memory endpoints: no sockets, no sleeping."""

from __future__ import annotations

import asyncio

from kvtransit.agents.decode.agent import DecodeAgent
from kvtransit.agents.process import Address
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import ManualClock
from kvtransit.wire import ErrorCode
from kvtransit.wire.events import Ack, AckStatus, Error, KvBegin, Role, Tokens

from ._manual_time import cancel, collect, greeted_pair
from ._wire_samples import kv_stream

SCENARIO = Scenario(codec="none", dilation=3.0)
ANY = Address("127.0.0.1", 0)
T0 = 10**12
OUTPUT = 100


def gone(request_id: int) -> Error:
    return Error(code=ErrorCode.REQUEST_FAILED, message="client gone", request_id=request_id)


async def start(clock):
    agent = DecodeAgent(SCENARIO, name="decode-test", listen=ANY, client_listen=ANY, metrics_listen=ANY,
                        accuracy_sample=0, clock=clock)
    client, serving_client = await greeted_pair(Role.LOADGEN, Role.DECODE, agent.serve_client)
    link, serving_kv = await greeted_pair(Role.MIDDLEBOX, Role.DECODE, agent.ingress.serve_kv)
    tokens: list = []
    tasks = [serving_client, serving_kv, collect(client, clock, tokens), asyncio.create_task(agent.step_loop())]
    return agent, client, link, tokens, tasks


async def hand_off(link, request_id: int) -> Ack:
    begin, *chunks = kv_stream(request_id)
    assert isinstance(begin, KvBegin)
    for event in [KvBegin(request_id, begin.prompt_tokens, OUTPUT, begin.n_layers, begin.n_chunks, begin.raw_bytes,
                          begin.codec, begin.first_token_ns), *chunks]:
        await link.send(event)
    await link.send(link.connection.kv_end(request_id))
    return await link.next_event()


def indices(tokens, request_id: int) -> list[int]:
    return [e.token_index for event, _ in tokens if isinstance(event, Tokens) for e in event.entries
            if e.request_id == request_id]


async def test_a_running_request_withdrawn_by_its_client_gets_no_more_tokens_and_frees_its_reservation():
    clock = ManualClock(T0)
    agent, client, link, tokens, tasks = await start(clock)
    try:
        assert (await hand_off(link, 5)).status == AckStatus.OK
        await clock.advance(0.5)  # ~27 steps of ~18 ms (wall, at dilation 3): tokens 1.. are out
        made = indices(tokens, 5)
        assert 2 < len(made) < OUTPUT - 20
        assert agent.stats()["batch"]["kv_reserved_tokens"] == 8 + OUTPUT
        await client.send(gone(5))
        await clock.advance_ns(0)
        assert agent.stats()["batch"] == {"waiting": 0, "running": 0, "kv_reserved_tokens": 0}
        assert agent.stats()["cancelled"] == {"batch": 1, "before_kv": 0}
        made_by_decode = agent.tokens
        await clock.advance(5.0)  # long enough for all 100 tokens, had it run
        assert agent.tokens == made_by_decode  # the step being held when it left made none for it either
        assert indices(tokens, 5) == made and agent.outcomes == {"ok": 0, "failed": 0}
    finally:
        await cancel(*tasks)


async def test_kv_arriving_after_its_client_left_is_dropped_with_a_failed_ack_and_never_decoded():
    clock = ManualClock(T0)
    agent, client, link, tokens, tasks = await start(clock)
    try:
        await client.send(gone(9))
        await clock.advance_ns(0)
        ack = await hand_off(link, 9)
        assert (ack.status, ack.detail) == (AckStatus.FAILED, "client gone")
        await clock.advance(1.0)
        assert indices(tokens, 9) == []  # not even "KV ready"
        stats = agent.stats()
        assert stats["batch"]["kv_reserved_tokens"] == 0 and stats["steps"] == 0
        assert stats["cancelled"] == {"batch": 0, "before_kv": 1} and stats["kv_handoffs"]["aborted"] == 1
        again = await hand_off(link, 9)  # a resend of it is dropped too
        assert again.status == AckStatus.FAILED and agent.stats()["kv_handoffs"]["taken"] == 0
    finally:
        await cancel(*tasks)
