"""An injectable clock: real (monotonic) for agents, manual for tests.

Everything that waits on model time goes through a `Clock`, so tests can step time by hand and the
fidelity guard can see how late each wake-up was. Deadlines are absolute integer nanoseconds on the
monotonic clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from kvtransit.runtime import precise_timer
from kvtransit.runtime.wakeup_priority import WakeupPriority

# How long before a deadline MonotonicClock stops sleeping and yields in a loop instead (the yield-spin).
# With a timerfd (runtime/precise_timer.py, Linux) the loop sleeps to within microseconds of the deadline and the
# spin covers the wake-up and whatever else the loop runs then (a wake-up from an idle vCPU alone takes 0.1-0.2 ms
# on this VM). Measured on the 2-core dev box, uvloop, 5 ms steps, 300 sleeps in each of 4 processes (a run's
# agents) beside one process spinning on a core (benchmarks/clock.py; benchmarks/RESULTS.md, Timers):
#   loop timer + 1 ms spin:  mean 50 µs late, p99 1985 µs, 19 % of a core each
#   timerfd + 500 µs spin:   mean 30 µs late, p99  157 µs, 11 % of a core each
#   timerfd + 200 µs spin:   mean 82 µs late, p99 1397 µs,  5 % of a core each
# 500 µs is as punctual as the 1 ms spin or better at ~60 % of its CPU, and the default `kvtransit up` stays
# faithful; 200 µs made the prefill's step timers 3.0 % late in one default run (the guard allows 3 %). Without a
# timerfd, the loops' timers have millisecond granularity, so 1 ms is the smallest spin that works on both loops:
#   uvloop:  no spin p50 298 µs late; 0.5 ms spin p50 0.9 µs; 1.0 ms spin p50 0.9 µs (17 % of a core)
#   asyncio: no spin p50 650 µs late; 0.5 ms spin p50 315 µs; 1.0 ms spin p50 1.3 µs (18 % of a core)
PRECISE_TIMER_SPIN_S = 500e-6
LOOP_TIMER_SPIN_S = 1e-3
# This VM's timer wake-ups run late in proportion to the wait, timerfd and the loop's timer alike (measured on the
# dev box, 2026-11-30: a 50 ms wait woke 0.5–1.5 ms late, 100 ms 1–3 ms, 200 ms 3–5 ms, i.e. 1–3 %; the same with
# time.sleep and a bare epoll), so a fixed spin cannot cover a long wait. A wait longer than the spin is cut: sleep
# to LONG_WAIT_MARGIN of what is left before the deadline, then again, until only the spin is left. At 5 % the first
# wake-up lands before the deadline while the late fraction stays under 5 %, and a 200 ms wait costs one or two
# extra wake-ups.
LONG_WAIT_MARGIN = 0.05

LatenessObserver = Callable[[float], None]


@runtime_checkable
class Clock(Protocol):
    timer: str  # what its sleeps wait on, for reports: "timerfd", "loop" (MonotonicClock) or "manual"

    def now_ns(self) -> int:
        """Monotonic time now, in integer nanoseconds."""
        ...

    async def sleep_until(self, deadline_ns: int) -> int:
        """Return at or after `deadline_ns`; the result is the lateness in ns (>= 0)."""
        ...


class MonotonicClock:
    """time.monotonic_ns; sleeps on the loop's timerfd (else its own timer), then yields for the last `spin_s`.

    The spin yields (asyncio.sleep(0)) rather than busy-waiting, so other tasks keep running; it costs
    CPU only for the last `spin_s` of each sleep. `observe_lateness(seconds)` is called after every
    sleep (the fidelity guard's timer-lateness histogram hangs here). `timer` says what the sleep waits on:
    "timerfd" or "loop" (reported by the agents, so a run says how its holds were timed).
    """

    def __init__(self, *, spin_s: float | None = None, observe_lateness: LatenessObserver | None = None,
                 use_timerfd: bool = True, wakeup_priority: WakeupPriority | None = None):
        """`spin_s`: None for the default of the timer in use (PRECISE_TIMER_SPIN_S or LOOP_TIMER_SPIN_S);
        `use_timerfd=False` keeps to the loop's own timer (benchmarks/clock.py compares the two);
        `wakeup_priority`: taken for the end of each sleep (runtime/wakeup_priority.py), None for none."""
        self.timer = "timerfd" if use_timerfd and precise_timer.available() else "loop"
        if spin_s is None:
            spin_s = PRECISE_TIMER_SPIN_S if self.timer == "timerfd" else LOOP_TIMER_SPIN_S
        if not spin_s >= 0:
            raise ValueError(f"spin_s must be >= 0, got {spin_s!r}")
        self._spin_ns = int(spin_s * 1e9)
        self.observe_lateness = observe_lateness
        self.wakeup_priority = wakeup_priority

    @property
    def spin_s(self) -> float:
        return self._spin_ns / 1e9

    def now_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep_until(self, deadline_ns: int) -> int:
        timer = precise_timer.for_running_loop() if self.timer == "timerfd" else None
        priority = self.wakeup_priority if self.wakeup_priority is not None and self.wakeup_priority.available else None
        promoted = False
        try:
            # A long wait in steps (LONG_WAIT_MARGIN says why): each wakes before the deadline by a share of what
            # is left. Within the priority's lead of the deadline, the rest is waited at real-time priority.
            while (remaining := deadline_ns - time.monotonic_ns()) > self._spin_ns:
                if priority is not None and not promoted and remaining <= priority.lead_ns + self._spin_ns:
                    priority.promote()
                    promoted = True
                wake_ns = deadline_ns - max(self._spin_ns, int(remaining * LONG_WAIT_MARGIN))
                if priority is not None and not promoted:  # wake at the window's start at the latest
                    wake_ns = min(wake_ns, deadline_ns - self._spin_ns - priority.lead_ns)
                if timer is not None:
                    await timer.wait_until(wake_ns)
                else:
                    await asyncio.sleep((wake_ns - time.monotonic_ns()) / 1e9)
            # The spin covers what the wait cannot (PRECISE_TIMER_SPIN_S, LOOP_TIMER_SPIN_S): the loop's own
            # wake-up after a timerfd, or the loop timer's millisecond granularity; sleep(0) lets other tasks run.
            while time.monotonic_ns() < deadline_ns:  # noqa: ASYNC110 — deliberate yield-spin to the deadline
                await asyncio.sleep(0)
            lateness = time.monotonic_ns() - deadline_ns
        finally:
            if promoted and priority is not None:
                priority.demote()
        if self.observe_lateness is not None:
            self.observe_lateness(lateness / 1e9)
        return lateness


class ManualClock:
    """A clock that moves only when a test says so; sleepers wake in deadline order.

    `await advance(seconds)` walks time forward through every pending deadline in order: at each one
    it wakes the sleepers due then and lets the loop run them (they may sleep again, at a deadline
    that is itself walked through) before moving on.
    """

    # Loop iterations given to woken tasks at each step. Enough for a task to wake, do a few
    # call_soon hops (memory transports use them) and go back to sleep.
    SETTLE_ROUNDS = 64
    timer = "manual"

    def __init__(self, start_ns: int = 0):
        self._now_ns = start_ns
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_ns(self) -> int:
        return self._now_ns

    @property
    def pending(self) -> int:
        return sum(1 for *_, fut in self._sleepers if not fut.done())

    async def sleep_until(self, deadline_ns: int) -> int:
        if deadline_ns <= self._now_ns:
            await asyncio.sleep(0)  # a real clock also yields; keep interleavings honest
            return self._now_ns - deadline_ns
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline_ns, next(self._seq), fut))
        await fut
        return self._now_ns - deadline_ns

    async def advance(self, seconds: float) -> None:
        await self.advance_ns(round(seconds * 1e9))

    async def advance_ns(self, delta_ns: int) -> None:
        if delta_ns < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {delta_ns} ns)")
        target = self._now_ns + delta_ns
        await self._settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline = self._sleepers[0][0]
            self._now_ns = deadline
            while self._sleepers and self._sleepers[0][0] == deadline:
                _, _, fut = heapq.heappop(self._sleepers)
                if not fut.done():
                    fut.set_result(None)
            await self._settle()
        self._now_ns = target
        await self._settle()

    async def _settle(self) -> None:
        for _ in range(self.SETTLE_ROUNDS):
            await asyncio.sleep(0)


async def sleep_for(clock: Clock, seconds: float) -> int:
    """Hold `seconds` from now on `clock` (a relative wait: a fault's delay, a backoff); returns the lateness in ns.

    Model-time holds are absolute deadlines (DeadlineSchedule); this is for waits that are relative by nature,
    so they too run on the injected clock and a test can step them by hand."""
    return await clock.sleep_until(clock.now_ns() + max(0, round(seconds * 1e9)))


def wake_stamp_ns(deadline_ns: int, lateness_ns: int) -> int:
    """When a hold on a deadline woke: what a stepping agent stamps the step's end with (its tokens, its first token).

    Measured inside `sleep_until`, at the wake-up's real-time priority (runtime/wakeup_priority.py). A read of the
    clock after the sleep returns comes after the priority is given back, and on this 2-core VM the agent then
    waited 1-4 ms for a core at about half of its steps (the middlebox finishing its slice): first tokens stamped
    that late made light-load hand-offs through tc measure 0.96x the model (p10 0.90), faster than the link allows.
    That wait is the host's, after the step; the lateness `sleep_until` returns is the timer's, which the fidelity
    guard judges."""
    return deadline_ns + lateness_ns


class DeadlineSchedule:
    """Step k is due at t0 + Σ durations of steps before it: absolute deadlines, so timer error
    never accumulates (ARCHITECTURE.md, time and scale: hold on absolute deadlines)."""

    def __init__(self, clock: Clock, start_ns: int | None = None):
        self.clock = clock
        self.start_ns = clock.now_ns() if start_ns is None else start_ns
        # The sum is kept in float seconds and converted once per step: rounding each step to whole
        # nanoseconds first would drift by up to 0.5 ns a step.
        self._elapsed_s = 0.0
        self.steps = 0

    @property
    def deadline_ns(self) -> int:
        """When the last scheduled step ends."""
        return self.start_ns + round(self._elapsed_s * 1e9)

    def add(self, duration_s: float) -> int:
        """Schedule one more step of `duration_s`; returns its absolute deadline (ns)."""
        if not duration_s >= 0:
            raise ValueError(f"step duration must be >= 0 seconds, got {duration_s!r}")
        self._elapsed_s += duration_s
        self.steps += 1
        return self.deadline_ns

    async def hold(self, duration_s: float) -> int:
        """Schedule a step of `duration_s` and sleep until it ends; returns the lateness in ns."""
        return await self.clock.sleep_until(self.add(duration_s))
