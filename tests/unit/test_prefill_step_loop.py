"""The prefill's step loop on a ManualClock: each batch is held for its planned time on absolute deadlines, the
first token goes out at the deadline and the KV is stamped with it. No sockets, no sleeping."""

from __future__ import annotations

import asyncio

from kvtransit.agents.prefill.agent import PrefillAgent
from kvtransit.agents.prefill.handoffs import HANDOFF_DEADLINE_S
from kvtransit.agents.process import Address
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.prefill_plan import BatchEntry, plan_prefill_step
from kvtransit.runtime.clock import ManualClock
from kvtransit.wire.events import FirstToken, KvBegin, Request, Role

from ._manual_time import LateClock, SlowAfterWakeClock, cancel, collect, greeted_pair

SCENARIO = Scenario(codec="none", dilation=2.0)
ANY = Address("127.0.0.1", 0)
T0 = 10**12  # a clock far from 0, as CLOCK_MONOTONIC is


def wall_s(*requests: tuple[int, int, int]) -> float:
    """The planned hold of one step over (request id, prompt, output) requests."""
    return plan_prefill_step(SCENARIO, [BatchEntry(rid, p, o) for rid, p, o in requests]).wall_s


def wall_ns(*requests: tuple[int, int, int]) -> int:
    return round(wall_s(*requests) * 1e9)


async def start(clock):
    agent = PrefillAgent(SCENARIO, name="prefill-test", listen=ANY, kv_to=ANY, metrics_listen=ANY, clock=clock)
    client, serving = await greeted_pair(Role.LOADGEN, Role.PREFILL, agent.serve_client)
    received: list = []
    tasks = [serving, collect(client, clock, received), asyncio.create_task(agent.step_loop())]
    return agent, client, received, tasks


def first_tokens(received) -> dict[int, tuple[int, int]]:
    """request id → (the FirstToken's stamp, when it arrived)."""
    return {e.request_id: (e.t_ns, at) for e, at in received if isinstance(e, FirstToken)}


def queued_begins(agent) -> dict[int, tuple[KvBegin, int]]:
    """request id → (the KvBegin held for the middlebox, the hand-off's give-up deadline)."""
    return {rid: (held.begin, held.deadline_ns) for rid, held in agent.handoffs.held.items()}


async def test_a_batch_is_held_for_its_planned_time_and_its_first_token_comes_at_the_deadline():
    clock = ManualClock(T0)
    agent, client, received, tasks = await start(clock)
    try:
        await client.send(Request(request_id=1, prompt_tokens=1000, output_tokens=8, sent_ns=T0))
        deadline = T0 + wall_ns((1, 1000, 8))
        await clock.advance_ns(deadline - 1 - T0)
        assert first_tokens(received) == {}  # still held
        await clock.advance_ns(1)
        assert first_tokens(received) == {1: (deadline, deadline)}
        # Its KV was made during the step and queued for the middlebox, stamped with the first token's time.
        begin, handoff_deadline = queued_begins(agent)[1]
        assert begin.first_token_ns == deadline
        assert handoff_deadline == deadline + round(HANDOFF_DEADLINE_S * 1e9)
        assert agent.steps == 1
    finally:
        await cancel(*tasks)


async def test_back_to_back_steps_chain_on_deadlines_so_a_late_wake_up_is_not_carried_forward():
    manual = ManualClock(T0)
    late = 1_000_000  # every wake-up 1 ms late
    agent, client, received, tasks = await start(LateClock(manual, late))
    try:
        await client.send(Request(request_id=1, prompt_tokens=2000, output_tokens=8, sent_ns=T0))
        first = T0 + wall_ns((1, 2000, 8))
        await manual.advance_ns((first - T0) // 2)
        await client.send(Request(request_id=2, prompt_tokens=500, output_tokens=8, sent_ns=manual.now_ns()))
        # Step k ends at t0 + the sum of the holds before it: the second starts at the first's deadline, not at its
        # late wake-up.
        second = T0 + round((wall_s((1, 2000, 8)) + wall_s((2, 500, 8))) * 1e9)
        await manual.advance_ns(second + late - manual.now_ns())
        assert first_tokens(received) == {1: (first + late, first + late), 2: (second + late, second + late)}
        assert {rid: begin.first_token_ns for rid, (begin, _) in queued_begins(agent).items()} == {1: first,
                                                                                                  2: second}
    finally:
        await cancel(*tasks)


async def test_the_first_token_is_stamped_when_the_timer_woke_not_when_the_host_next_ran_the_prefill():
    # Reads of the clock after the wake-up are 3 ms late: the host's wait for a core once the timer's real-time
    # priority is given back, which once made hand-offs through tc measure 0.96x the model.
    manual = ManualClock(T0)
    agent, client, received, tasks = await start(SlowAfterWakeClock(manual, after_ns=3_000_000))
    try:
        await client.send(Request(request_id=1, prompt_tokens=1000, output_tokens=8, sent_ns=T0))
        deadline = T0 + wall_ns((1, 1000, 8))
        await manual.advance_ns(deadline - T0)
        assert first_tokens(received)[1][0] == deadline
        assert queued_begins(agent)[1][0].first_token_ns == deadline  # the hand-off starts from the same instant
    finally:
        await cancel(*tasks)


async def test_after_idling_the_next_step_starts_when_its_request_arrives():
    clock = ManualClock(T0)
    agent, client, received, tasks = await start(clock)
    try:
        await client.send(Request(request_id=1, prompt_tokens=1000, output_tokens=1, sent_ns=T0))
        await clock.advance(5.0)  # long idle after the first step
        arrival = clock.now_ns()
        await client.send(Request(request_id=2, prompt_tokens=1000, output_tokens=1, sent_ns=arrival))
        await clock.advance_ns(wall_ns((2, 1000, 1)))
        assert first_tokens(received)[2] == (arrival + wall_ns((2, 1000, 1)),) * 2
        # One output token: done at its first token, nothing handed off or held.
        assert queued_begins(agent) == {} and agent.admitted == {}
    finally:
        await cancel(*tasks)


async def test_one_step_takes_every_queued_request_and_holds_the_whole_batch():
    clock = ManualClock(T0)
    agent, client, received, tasks = await start(clock)
    try:
        for rid, prompt in ((1, 300), (2, 700)):  # both queued before the loop looks
            await client.send(Request(request_id=rid, prompt_tokens=prompt, output_tokens=4, sent_ns=T0))
        deadline = T0 + wall_ns((1, 300, 4), (2, 700, 4))
        await clock.advance_ns(deadline - T0)
        assert first_tokens(received) == {1: (deadline, deadline), 2: (deadline, deadline)}
        assert agent.steps == 1
    finally:
        await cancel(*tasks)
