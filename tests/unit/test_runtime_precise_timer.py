"""The timerfd wake-up source: deadlines kept in order on both loops, cancelled sleepers skipped, fds released.

Only ordering and "never early" are asserted: how late a wake-up is depends on the box (benchmarks/clock.py).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time

import pytest

from kvtransit.runtime import precise_timer
from kvtransit.runtime.clock import LOOP_TIMER_SPIN_S, PRECISE_TIMER_SPIN_S, MonotonicClock
from kvtransit.runtime.loop import run

pytestmark = pytest.mark.skipif(not precise_timer.available(), reason="timerfd is Linux-only")


def _timerfds() -> set[int]:
    """This process's open timerfds (listing /proc opens an fd of its own, so fds are told apart by kind)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[timerfd]":
                found.add(int(name))
        except OSError:
            pass  # the listing's own fd, closed by now
    return found


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_waiters_wake_in_deadline_order_and_never_early(loop):
    async def main() -> list[tuple[int, int]]:
        timer = precise_timer.for_running_loop()
        assert timer is not None and timer is precise_timer.for_running_loop()  # one per loop
        start = time.monotonic_ns()
        # Armed out of order: a later deadline first, then an earlier one must re-arm the fd sooner.
        deadlines = [start + ms * 1_000_000 for ms in (6, 2, 4, 2)]
        woke: list[tuple[int, int]] = []

        async def sleeper(deadline: int) -> None:
            await timer.wait_until(deadline)
            woke.append((deadline, time.monotonic_ns()))

        await asyncio.gather(*(sleeper(d) for d in deadlines))
        assert timer.pending == 0
        return woke

    woke = run(main(), loop=loop)
    assert [d for d, _ in woke] == sorted(d for d, _ in woke)
    assert all(at >= deadline for deadline, at in woke)


def test_a_deadline_already_past_completes_at_once():
    async def main() -> None:
        timer = precise_timer.for_running_loop()
        assert timer is not None
        await asyncio.wait_for(timer.wait_until(time.monotonic_ns() - 1_000_000), timeout=1.0)
        await asyncio.wait_for(timer.wait_until(0), timeout=1.0)  # 0 would disarm a timerfd: still wakes

    run(main(), loop="uvloop")


def test_a_cancelled_sleeper_does_not_hold_back_the_others():
    async def main() -> None:
        timer = precise_timer.for_running_loop()
        assert timer is not None
        now = time.monotonic_ns()
        early = asyncio.ensure_future(timer.wait_until(now + 1_000_000))
        late = asyncio.ensure_future(timer.wait_until(now + 3_000_000))
        early.cancel()
        await asyncio.wait_for(late, timeout=1.0)
        assert early.cancelled() and timer.pending == 0

    run(main(), loop="uvloop")


def test_each_loop_gets_its_own_fd_and_gives_it_back_when_the_loop_is_gone():
    before = _timerfds()

    async def main() -> int:
        timer = precise_timer.for_running_loop()
        assert timer is not None
        await timer.wait_until(time.monotonic_ns() + 500_000)
        return timer.fd

    fds = [run(main(), loop=loop) for loop in ("uvloop", "asyncio")]
    assert fds[0] != -1 and fds[1] != -1
    gc.collect()
    assert _timerfds() <= before


def test_close_releases_the_fd_once():
    async def main() -> None:
        timer = precise_timer.PreciseTimer(asyncio.get_running_loop(), precise_timer._LIBC)
        fd = timer.fd
        assert fd in _timerfds()
        timer.close()
        timer.close()
        assert timer.fd == -1 and fd not in _timerfds()
        with pytest.raises(RuntimeError, match="closed"):
            timer.wait_until(time.monotonic_ns())

    run(main(), loop="uvloop")


def test_the_clock_sleeps_on_the_timerfd_and_spins_only_for_the_wake_up():
    assert sys.platform.startswith("linux")
    clock = MonotonicClock()
    assert clock.timer == "timerfd" and clock.spin_s == PRECISE_TIMER_SPIN_S < LOOP_TIMER_SPIN_S
    on_the_loop = MonotonicClock(use_timerfd=False)
    assert on_the_loop.timer == "loop" and on_the_loop.spin_s == LOOP_TIMER_SPIN_S

    async def main() -> int:
        deadline = clock.now_ns() + 3_000_000
        lateness = await clock.sleep_until(deadline)
        assert clock.now_ns() >= deadline and lateness >= 0
        assert asyncio.get_running_loop() in precise_timer._TIMERS  # the sleep made this loop's timer
        return lateness

    run(main(), loop="uvloop")
