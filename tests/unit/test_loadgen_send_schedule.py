"""The load generator's open-loop send schedule on a ManualClock: request k leaves at t0 + its arrival × dilation,
whatever is in flight, stamped with that time; with max_concurrency it also waits for a free slot. The drain
allowance after the last send and the ledger's `t` stamps run on the same clock. No sockets, no sleeping."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from kvtransit.agents.loadgen.agent import LoadGenerator
from kvtransit.agents.loadgen.ledger_writer import LedgerWriter
from kvtransit.agents.process import Address
from kvtransit.model.judge.slo import Outcome
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import ManualClock
from kvtransit.runtime.transport import memory_pair
from kvtransit.wire.errors import ErrorCode
from kvtransit.wire.events import Bye, Error, Hello, Request, Role

from ._manual_time import cancel, collect, hello

ANY = Address("127.0.0.1", 0)
T0 = 10**12


async def start(scenario: Scenario, clock: ManualClock, *, drain_timeout_s: float | None = None):
    """A load generator driving one in-memory prefill (no decode), and what that prefill receives."""
    loadgen = LoadGenerator(scenario, name="loadgen-test", prefills=[ANY], decodes=[], metrics_listen=ANY,
                            drain_timeout_s=drain_timeout_s, clock=clock)
    ours, prefill = memory_pair(Role.LOADGEN, Role.PREFILL)
    await ours.send(hello(Role.LOADGEN))
    await prefill.send(hello(Role.PREFILL))
    assert isinstance(await ours.next_event(), Hello) and isinstance(await prefill.next_event(), Hello)
    received: list = []
    stop = asyncio.Event()
    driving = asyncio.create_task(loadgen.drive([ours], [], stop))
    return loadgen, prefill, received, Run(stop, driving, collect(prefill, clock, received))


@dataclass
class Run:
    stop: asyncio.Event
    driving: asyncio.Task
    reading: asyncio.Task

    async def end(self) -> None:
        """Stop the drive as a signal would (every open request timed out, Bye sent), then stop reading."""
        self.stop.set()
        await self.driving
        await cancel(self.reading)


def requests(received) -> list[tuple[int, int, int]]:
    """(request id, its sent_ns, when the prefill got it) for every Request received."""
    return [(e.request_id, e.sent_ns, at) for e, at in received if isinstance(e, Request)]


def due_ns(scenario: Scenario, arrival_s: float) -> int:
    return T0 + round(scenario.wall_s(arrival_s) * 1e9)


async def test_each_request_is_sent_at_t0_plus_its_arrival_times_the_dilation_whatever_is_in_flight():
    scenario = Scenario(codec="none", requests=6, rate=4.0, dilation=2.0)
    clock = ManualClock(T0)
    loadgen, _prefill, received, run = await start(scenario, clock)
    try:
        for k, spec in enumerate(loadgen.workload):
            due = due_ns(scenario, spec.arrival_s)
            await clock.advance_ns(due - 1 - clock.now_ns())
            assert len(requests(received)) == k  # not a nanosecond early
            await clock.advance_ns(1)
            assert requests(received)[k] == (spec.request_id, due, due)
        progress = loadgen.snapshot()
        assert progress["sent"] == progress["in_flight"] == len(loadgen.workload)  # none finished: open loop
    finally:
        await run.end()


async def test_with_max_concurrency_a_request_past_its_arrival_waits_for_a_free_slot():
    scenario = Scenario(codec="none", requests=3, rate=4.0, max_concurrency=1)
    clock = ManualClock(T0)
    loadgen, prefill, received, run = await start(scenario, clock)
    first, second, _ = loadgen.workload
    try:
        await clock.advance_ns(due_ns(scenario, second.arrival_s) + 10**9 - T0)
        assert [rid for rid, *_ in requests(received)] == [first.request_id]  # the second is due, but no slot
        freed = clock.now_ns()
        await prefill.send(Error(code=ErrorCode.REQUEST_FAILED, message="test: the first request ended",
                                 request_id=first.request_id))
        await clock.advance_ns(0)
        assert requests(received)[1] == (second.request_id, freed, freed)  # sent (and stamped) when the slot freed
    finally:
        await run.end()


async def test_requests_still_open_when_the_drain_allowance_has_passed_on_the_clock_are_timed_out():
    scenario = Scenario(codec="none", requests=2, rate=4.0, dilation=2.0)
    clock = ManualClock(T0)
    loadgen, _prefill, received, run = await start(scenario, clock, drain_timeout_s=5.0)
    try:
        over = due_ns(scenario, loadgen.workload[-1].arrival_s) + round(scenario.wall_s(5.0) * 1e9)
        await clock.advance_ns(over - 1 - T0)
        assert len(requests(received)) == 2 and not run.driving.done()  # all sent, still draining
        await clock.advance_ns(1)
        assert await run.driving == (over - T0) / 1e9  # the run's wall seconds end with the allowance
        assert [r.outcome for r in loadgen.records.values()] == [Outcome.TIMED_OUT] * 2
        assert any(isinstance(e, Bye) for e, _ in received)  # the prefill was told the run is over
    finally:
        await run.end()


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
