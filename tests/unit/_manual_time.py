"""Helpers for driving an agent's loops on a ManualClock over in-memory endpoints (no sockets, no sleeping)."""

from __future__ import annotations

import asyncio
import contextlib

from kvtransit.runtime.clock import ManualClock
from kvtransit.runtime.transport import Endpoint, memory_pair
from kvtransit.wire.events import Hello, Role
from kvtransit.wire.limits import WIRE_VERSION


class LateClock:
    """A ManualClock whose sleepers all wake `late_ns` after their deadline: a timer that is always late."""

    timer = "manual"

    def __init__(self, manual: ManualClock, late_ns: int):
        self.manual, self.late_ns = manual, late_ns

    def now_ns(self) -> int:
        return self.manual.now_ns()

    async def sleep_until(self, deadline_ns: int) -> int:
        await self.manual.sleep_until(deadline_ns + self.late_ns)
        return self.manual.now_ns() - deadline_ns


class SlowAfterWakeClock:
    """A ManualClock whose sleepers wake on time but read the clock `after_ns` later: an agent that woke at real-time
    priority, gave it back and waited that long for a core (runtime/wakeup_priority.py) before its next read.
    Reads stay late by `after_ns` until it sleeps again; sleeps are judged against the manual time."""

    timer = "manual"

    def __init__(self, manual: ManualClock, after_ns: int):
        self.manual, self.after_ns = manual, after_ns
        self._behind_ns = 0

    def now_ns(self) -> int:
        return self.manual.now_ns() + self._behind_ns

    async def sleep_until(self, deadline_ns: int) -> int:
        self._behind_ns = 0
        await self.manual.sleep_until(deadline_ns)
        lateness = self.manual.now_ns() - deadline_ns  # measured at the wake-up, as MonotonicClock does
        self._behind_ns = self.after_ns
        return lateness


def hello(role: Role) -> Hello:
    return Hello(role=role, version=WIRE_VERSION, name=f"{role.name.lower()}-test")


async def greeted_pair(ours: Role, theirs: Role, serve) -> tuple[Endpoint, asyncio.Task]:
    """Our endpoint to `serve(their_endpoint)` (an agent's handler, which says Hello first), greeted."""
    endpoint, served = memory_pair(ours, theirs)
    task = asyncio.create_task(serve(served))
    await endpoint.send(hello(ours))
    assert isinstance(await endpoint.next_event(), Hello)
    return endpoint, task


def collect(endpoint: Endpoint, clock, into: list) -> asyncio.Task:
    """Append (event, clock time of receipt) for everything `endpoint` receives."""

    async def read() -> None:
        while (event := await endpoint.next_event()) is not None:
            into.append((event, clock.now_ns()))

    return asyncio.create_task(read())


async def prefill_link_to_memory_middlebox(clock: ManualClock):
    """A prefill's HandoffLink greeted over memory to a middlebox end this test reads, and a client endpoint for its
    hand-offs: (link, the middlebox's end, client, the link's metrics registry)."""
    from kvtransit.agents.prefill.handoffs import HandoffLink
    from kvtransit.agents.process import Address, new_registry
    from kvtransit.runtime import metrics as runtime_metrics

    registry, _ = new_registry("prefill")
    link = HandoffLink(name="prefill-test", kv_to=Address("127.0.0.1", 0), clock=clock,
                       metrics=runtime_metrics.prefill_metrics(registry))
    ours, middlebox = memory_pair(Role.PREFILL, Role.MIDDLEBOX)
    await ours.send(hello(Role.PREFILL))
    await middlebox.send(hello(Role.MIDDLEBOX))
    assert (await ours.next_event()).role == Role.MIDDLEBOX
    link.link = ours
    client, _loadgen = memory_pair(Role.PREFILL, Role.LOADGEN)
    return link, middlebox, client, registry


def count_loop_turns(turns: list[int]) -> asyncio.Task:
    """A task appending to `turns` at each turn of the loop (cancel it when done): `len(turns)` read at two events
    says whether the loop ran other tasks between them."""

    async def count() -> None:
        while True:
            turns.append(1)
            await asyncio.sleep(0)

    return asyncio.create_task(count())


async def cancel(*tasks: asyncio.Task) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
