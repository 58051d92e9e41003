"""Decode's step loop on a ManualClock: a hand-off's KV is stamped ready on arrival, then each step holds the
roofline decode time of the running batch on absolute deadlines. No sockets, no sleeping."""

from __future__ import annotations

import asyncio

import pytest

from kvtransit.agents.decode.agent import DecodeAgent
from kvtransit.agents.process import Address
from kvtransit.model.cost.roofline import decode_step_s, decode_work, step_energy_j
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.policies import DecodeBatcher, ServingRequest
from kvtransit.runtime.clock import ManualClock
from kvtransit.wire.events import Ack, AckStatus, Role, Tokens

from ._manual_time import LateClock, SlowAfterWakeClock, cancel, collect, greeted_pair
from ._wire_samples import kv_stream

SCENARIO = Scenario(codec="none", dilation=3.0)
ANY = Address("127.0.0.1", 0)
T0 = 10**12


def step_holds_s(*requests: ServingRequest, steps: int) -> list[float]:
    """The wall seconds each of the first `steps` decode steps holds for these requests (the model's batcher)."""
    batcher = DecodeBatcher(SCENARIO.kv_capacity_tokens)
    for request in requests:
        batcher.enqueue(request)
    holds = []
    for _ in range(steps):
        batcher.admit()
        holds.append(SCENARIO.wall_s(decode_step_s(SCENARIO.model_spec, SCENARIO.device_spec, SCENARIO.gpus,
                                                   batcher.running, batcher.context_tokens)))
        batcher.step()
    return holds


async def start(clock, scenario: Scenario = SCENARIO):
    agent = DecodeAgent(scenario, name="decode-test", listen=ANY, client_listen=ANY, metrics_listen=ANY,
                        accuracy_sample=0, clock=clock)
    client, serving_client = await greeted_pair(Role.LOADGEN, Role.DECODE, agent.serve_client)
    link, serving_kv = await greeted_pair(Role.MIDDLEBOX, Role.DECODE, agent.ingress.serve_kv)
    tokens: list = []
    tasks = [serving_client, serving_kv, collect(client, clock, tokens), asyncio.create_task(agent.step_loop())]
    return agent, link, tokens, tasks


async def hand_off(link, request_id: int) -> Ack:
    for event in kv_stream(request_id):
        await link.send(event)
    await link.send(link.connection.kv_end(request_id))
    return await link.next_event()


def token_times(tokens) -> dict[int, int]:
    """token index → its stamp, for every Tokens entry received."""
    return {e.token_index: e.t_ns for event, _ in tokens if isinstance(event, Tokens) for e in event.entries}


async def test_kv_ready_is_stamped_on_arrival_and_each_step_ends_on_its_absolute_deadline():
    clock = ManualClock(T0)
    agent, link, tokens, tasks = await start(clock)
    try:
        ack = await hand_off(link, 5)  # prompt 8, output 4: three decode steps
        assert (ack.status, ack.t_ns) == (AckStatus.OK, T0)
        await clock.advance_ns(0)
        assert token_times(tokens) == {0: T0}
        holds = step_holds_s(ServingRequest(5, 8, 4), steps=3)
        deadlines = [T0 + round(sum(holds[:k + 1]) * 1e9) for k in range(3)]
        await clock.advance_ns(deadlines[0] - 1 - T0)
        assert token_times(tokens) == {0: T0}  # the first step is still held
        await clock.advance_ns(deadlines[2] - clock.now_ns())
        assert token_times(tokens) == {0: T0, 1: deadlines[0], 2: deadlines[1], 3: deadlines[2]}
        assert agent.steps == 3 and agent.outcomes["ok"] == 1
    finally:
        await cancel(*tasks)


async def test_a_late_wake_up_is_not_carried_into_the_next_step():
    manual = ManualClock(T0)
    late = 2_000_000  # every wake-up 2 ms late
    _agent, link, tokens, tasks = await start(LateClock(manual, late))
    try:
        await hand_off(link, 5)
        holds = step_holds_s(ServingRequest(5, 8, 4), steps=3)
        deadlines = [T0 + round(sum(holds[:k + 1]) * 1e9) for k in range(3)]
        await manual.advance_ns(deadlines[2] + late - T0)
        # Each token is stamped at its (late) wake-up, but step k still ends at t0 + Σ holds: TPOT does not grow.
        assert token_times(tokens) == {0: T0, **{k + 1: deadlines[k] + late for k in range(3)}}
    finally:
        await cancel(*tasks)


async def test_tokens_are_stamped_when_the_step_timer_woke_not_when_the_host_next_ran_decode():
    manual = ManualClock(T0)
    after = 2_000_000  # each read after a wake-up 2 ms late: the host's wait for a core, not the step's
    _agent, link, tokens, tasks = await start(SlowAfterWakeClock(manual, after))
    try:
        await hand_off(link, 5)
        holds = step_holds_s(ServingRequest(5, 8, 4), steps=3)
        deadlines = [T0 + round(sum(holds[:k + 1]) * 1e9) for k in range(3)]
        await manual.advance_ns(deadlines[2] - T0)
        assert token_times(tokens) == {0: T0, **{k + 1: deadlines[k] for k in range(3)}}
    finally:
        await cancel(*tasks)


async def test_with_nothing_running_the_loop_holds_no_step():
    clock = ManualClock(T0)
    agent, _link, tokens, tasks = await start(clock)
    try:
        await clock.advance(10.0)
        assert agent.steps == 0 and tokens == [] and clock.pending == 0  # waiting for work, not on the clock
    finally:
        await cancel(*tasks)


async def test_a_kv_that_arrives_mid_step_waits_in_decodes_queue_until_the_next_step_boundary():
    clock = ManualClock(T0)
    agent, link, _tokens, tasks = await start(clock)
    try:
        await hand_off(link, 5)  # at T0, the batch empty: admitted at once
        await clock.advance_ns(0)
        first_deadline = T0 + round(step_holds_s(ServingRequest(5, 8, 4), steps=1)[0] * 1e9)
        arrived = T0 + (first_deadline - T0) // 4  # a quarter into the first step
        await clock.advance_ns(arrived - T0)
        await hand_off(link, 6)
        await clock.advance_ns(first_deadline - clock.now_ns())
        # Model seconds (÷ dilation): 6 waited the rest of the step, 5 not at all.
        assert agent.queue_waits.waits_s == {5: 0.0, 6: SCENARIO.model_s((first_deadline - arrived) / 1e9)}
        assert agent.registry.get_sample_value("kvtransit_decode_queue_wait_seconds_count") == 2
    finally:
        await cancel(*tasks)


async def test_the_step_that_admits_a_gpu_encoded_kv_is_held_longer_by_its_inverse_and_pays_its_energy():
    gpu = Scenario(codec="freq-keep-k", compress_at="gpu", dilation=3.0)
    clock = ManualClock(T0)
    agent, link, tokens, tasks = await start(clock, gpu)
    try:
        await hand_off(link, 5)  # prompt 8, output 4: three decode steps, the first admits it
        await clock.advance_ns(0)
        holds = step_holds_s(ServingRequest(5, 8, 4), steps=3)
        inverse_s = gpu.gpu_codec_inverse_s(8)
        assert inverse_s > 0
        holds[0] += gpu.wall_s(inverse_s)  # only the admitting step inverts; the others hold as before
        deadlines = [T0 + round(sum(holds[:k + 1]) * 1e9) for k in range(3)]
        await clock.advance_ns(deadlines[0] - 1 - T0)
        assert 1 not in token_times(tokens)  # still held by the inverse
        await clock.advance_ns(deadlines[2] - clock.now_ns())
        assert token_times(tokens) == {0: T0, 1: deadlines[0], 2: deadlines[1], 3: deadlines[2]}
        model, device = gpu.model_spec, gpu.device_spec
        decode_j = sum(step_energy_j(device, decode_work(model, 1, 8 + k)) for k in (1, 2, 3))
        inverse_j = step_energy_j(device, gpu.gpu_codec_inverse_work(8))
        assert agent.gpu_energy_j == pytest.approx(decode_j + inverse_j)
    finally:
        await cancel(*tasks)
