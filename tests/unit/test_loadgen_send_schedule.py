"""The load generator's open-loop send schedule on a ManualClock: request k leaves at t0 + its arrival × dilation,
whatever is in flight, stamped with that time; with max_concurrency it also waits for a free slot. The ledger's
`t` stamps come from the same clock. No sockets, no sleeping."""

from __future__ import annotations

import asyncio
import json
import time

from kvtransit.agents.common.process import Address
from kvtransit.agents.loadgen.agent import LoadGenerator
from kvtransit.agents.loadgen.ledger_writer import LedgerWriter
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import ManualClock
from kvtransit.runtime.transport import memory_pair
from kvtransit.wire.events import Hello, Request, Role

from ._manual_time import cancel, collect, hello

ANY = Address("127.0.0.1", 0)
T0 = 10**12


async def start(scenario: Scenario, clock: ManualClock):
    loadgen = LoadGenerator(scenario, name="loadgen-test", prefills=[ANY], decodes=[], metrics_listen=ANY,
                            clock=clock)
    ours, prefill = memory_pair(Role.LOADGEN, Role.PREFILL)
    await ours.send(hello(Role.LOADGEN))
    await prefill.send(hello(Role.PREFILL))
    assert isinstance(await ours.next_event(), Hello) and isinstance(await prefill.next_event(), Hello)
    received: list = []
    loadgen._t0_ns = clock.now_ns()
    tasks = [collect(prefill, clock, received), asyncio.create_task(loadgen._dispatch([ours]))]
    return loadgen, received, tasks


def requests(received) -> list[tuple[int, int, int]]:
    """(request id, its sent_ns, when the prefill got it) for every Request received."""
    return [(e.request_id, e.sent_ns, at) for e, at in received if isinstance(e, Request)]


async def test_each_request_is_sent_at_t0_plus_its_arrival_times_the_dilation_whatever_is_in_flight():
    scenario = Scenario(codec="none", requests=6, rate=4.0, dilation=2.0)
    clock = ManualClock(T0)
    loadgen, received, tasks = await start(scenario, clock)
    try:
        for k, spec in enumerate(loadgen.workload):
            due = T0 + round(scenario.wall_s(spec.arrival_s) * 1e9)
            await clock.advance_ns(due - 1 - clock.now_ns())
            assert len(requests(received)) == k  # not a nanosecond early
            await clock.advance_ns(1)
            assert requests(received)[k] == (spec.request_id, due, due)
        assert loadgen._all_sent and len(loadgen._open) == len(loadgen.workload)  # none finished: open loop
    finally:
        await cancel(*tasks)


async def test_with_max_concurrency_a_request_past_its_arrival_waits_for_a_free_slot():
    scenario = Scenario(codec="none", requests=3, rate=4.0, max_concurrency=1)
    clock = ManualClock(T0)
    loadgen, received, tasks = await start(scenario, clock)
    first, second, _ = loadgen.workload
    try:
        await clock.advance_ns(T0 + round(scenario.wall_s(second.arrival_s) * 1e9) + 10**9 - T0)
        assert [rid for rid, *_ in requests(received)] == [first.request_id]  # the second is due, but no slot
        freed = clock.now_ns()
        loadgen._fail(first.request_id, "test: the first request ended")
        await clock.advance_ns(0)
        assert requests(received)[1] == (second.request_id, freed, freed)  # sent (and stamped) when the slot freed
    finally:
        await cancel(*tasks)


def test_ledger_times_come_from_the_injected_clock_in_seconds(tmp_path):
    clock = ManualClock(5_500_000_000)
    ledger = LedgerWriter(tmp_path / "ledger.jsonl", clock=clock)
    ledger.kv_ready(1, "decode-0")
    ledger.outcome(1, "ok", None)
    ledger.close()
    records = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [r["t"] for r in records] == [5.5, 5.5]


def test_by_default_ledger_times_are_clock_monotonic_seconds(tmp_path):
    before = time.monotonic()
    ledger = LedgerWriter(tmp_path / "ledger.jsonl")
    ledger.outcome(1, "ok", None)
    ledger.close()
    after = time.monotonic()
    (record,) = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert before <= record["t"] <= after  # the host's shared clock: chaos lines faults up against it
