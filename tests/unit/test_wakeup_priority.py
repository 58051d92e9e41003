"""Real-time priority is taken for a timer's wake-up and given back after it (runtime/wakeup_priority.py)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.wakeup_priority import RT_PRIORITY, WakeupPriority, probe


class RecordingSetter:
    """os.sched_setscheduler's stand-in: records (policy, priority, when) and can refuse."""

    def __init__(self, refuse: BaseException | None = None):
        self.calls: list[tuple[int, int, int]] = []
        self.refuse = refuse

    def __call__(self, pid: int, policy: int, param: os.sched_param) -> None:
        assert pid == 0, "only the calling thread's policy is ever changed"
        if self.refuse is not None:
            raise self.refuse
        self.calls.append((policy, param.sched_priority, time.monotonic_ns()))


def test_nested_holders_take_it_once_and_the_last_to_leave_gives_it_back():
    setter = RecordingSetter()
    wakeup = WakeupPriority(setter=setter)
    wakeup.promote()
    wakeup.promote()
    wakeup.demote()
    assert wakeup.held and [c[:2] for c in setter.calls] == [(os.SCHED_RR, RT_PRIORITY)]
    wakeup.demote()
    assert not wakeup.held and [c[:2] for c in setter.calls] == [(os.SCHED_RR, RT_PRIORITY), (os.SCHED_OTHER, 0)]
    with pytest.raises(RuntimeError, match="without a matching promote"):
        wakeup.demote()


def test_two_agents_on_one_thread_share_it_and_the_last_to_leave_gives_it_back():
    setter = RecordingSetter()
    prefill, decode = WakeupPriority(setter=setter), WakeupPriority(setter=setter)
    prefill.promote()
    decode.promote()
    prefill.demote()  # decode is still inside its window: the thread stays real-time
    assert [c[0] for c in setter.calls] == [os.SCHED_RR]
    decode.demote()
    assert [c[0] for c in setter.calls] == [os.SCHED_RR, os.SCHED_OTHER]


@pytest.mark.parametrize("bad", [0, 100])
def test_a_priority_outside_sched_rr_range_is_refused(bad):
    with pytest.raises(ValueError, match="1-99"):
        WakeupPriority(bad)


def test_a_host_that_refuses_real_time_priority_says_why_and_timers_stay_normal():
    wakeup = probe(setter=RecordingSetter(refuse=PermissionError(1, "Operation not permitted")))
    assert not wakeup.available and not wakeup.held
    assert wakeup.describe().startswith("normal: no permission for SCHED_RR")
    other = probe(setter=RecordingSetter(refuse=OSError(22, "Invalid argument")))
    assert other.describe() == "normal: SCHED_RR refused (Invalid argument)"


async def test_a_sleep_takes_priority_only_within_its_lead_of_the_deadline_and_gives_it_back():
    setter = RecordingSetter()
    wakeup = WakeupPriority(lead_s=0.03, setter=setter)
    clock = MonotonicClock(wakeup_priority=wakeup)
    deadline = time.monotonic_ns() + 120_000_000
    await clock.sleep_until(deadline)
    (promote_policy, _, promoted_at), (demote_policy, _, demoted_at) = setter.calls
    assert (promote_policy, demote_policy) == (os.SCHED_RR, os.SCHED_OTHER)
    assert promoted_at >= deadline - wakeup.lead_ns - int(clock.spin_s * 1e9)  # not for the whole wait
    assert promoted_at < deadline <= demoted_at  # held through the wake-up, given back after it
    assert not wakeup.held and wakeup.promotions == 1


async def test_a_sleeper_cancelled_inside_its_window_gives_priority_back():
    setter = RecordingSetter()
    wakeup = WakeupPriority(lead_s=0.05, setter=setter)
    clock = MonotonicClock(wakeup_priority=wakeup)
    sleeper = asyncio.ensure_future(clock.sleep_until(time.monotonic_ns() + 40_000_000))
    await asyncio.sleep(0.01)
    assert wakeup.held
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    assert not wakeup.held and [c[0] for c in setter.calls] == [os.SCHED_RR, os.SCHED_OTHER]


async def test_an_unavailable_priority_is_never_taken():
    setter = RecordingSetter(refuse=PermissionError(1, "Operation not permitted"))
    clock = MonotonicClock(wakeup_priority=probe(setter=setter))
    await clock.sleep_until(time.monotonic_ns() + 2_000_000)
    assert setter.calls == []


@pytest.mark.skipif(not probe().available, reason="this host does not allow SCHED_RR (needs root or CAP_SYS_NICE)")
async def test_on_this_host_the_loop_thread_runs_real_time_at_the_deadline_and_normal_after():
    clock = MonotonicClock(wakeup_priority=WakeupPriority(lead_s=0.03))  # a wide window: a noisy box wakes late
    deadline = time.monotonic_ns() + 80_000_000
    seen: list[int] = []

    async def look_inside_the_window() -> None:  # another task of the same loop, i.e. the same thread
        await asyncio.sleep((deadline - 15_000_000 - time.monotonic_ns()) / 1e9)
        seen.append(os.sched_getscheduler(0))

    looker = asyncio.ensure_future(look_inside_the_window())
    await clock.sleep_until(deadline)
    await looker
    assert seen == [os.SCHED_RR]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
