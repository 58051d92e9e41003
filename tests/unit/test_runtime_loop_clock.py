"""Loop selection by name, the ManualClock, DeadlineSchedule and MonotonicClock's lateness reporting."""

from __future__ import annotations

import asyncio

import pytest

from kvtransit.model.errors import ConfigError
from kvtransit.runtime.clock import Clock, DeadlineSchedule, ManualClock, MonotonicClock
from kvtransit.runtime.loop import LOOP_CHOICES, resolve_loop, run, running_loop_name


@pytest.mark.parametrize("name", ["uvloop", "asyncio"])
def test_run_uses_the_named_loop_and_says_which(name):
    async def which():
        return running_loop_name()

    assert run(which(), loop=name) == name


def test_auto_prefers_uvloop_when_it_imports():
    assert resolve_loop("auto") == "uvloop"
    assert set(LOOP_CHOICES) == {"auto", "uvloop", "asyncio"}


def test_an_unknown_loop_name_is_a_config_error_naming_the_choices():
    with pytest.raises(ConfigError, match=r"unknown event loop 'trio'.*asyncio, auto, uvloop"):
        resolve_loop("trio")


async def test_manual_clock_wakes_sleepers_in_deadline_order():
    clock = ManualClock()
    woke: list[tuple[str, int]] = []

    async def sleeper(name, deadline):
        await clock.sleep_until(deadline)
        woke.append((name, clock.now_ns()))

    tasks = [asyncio.create_task(sleeper(n, d)) for n, d in (("c", 300), ("a", 100), ("b", 200))]
    await clock.advance_ns(250)
    assert woke == [("a", 100), ("b", 200)]
    assert clock.now_ns() == 250 and clock.pending == 1
    await clock.advance_ns(100)
    await asyncio.gather(*tasks)
    assert woke[-1] == ("c", 300)
    with pytest.raises(ValueError, match="backwards"):
        await clock.advance_ns(-1)


async def test_a_deadline_schedule_does_not_accumulate_lateness():
    clock = ManualClock()
    schedule = DeadlineSchedule(clock)
    done = []

    async def steps():
        for _ in range(1000):
            await schedule.hold(0.0061)  # 6.1 ms: not a whole number of anything
            done.append(clock.now_ns())

    task = asyncio.create_task(steps())
    # Time jumps past several deadlines at once (a late wake-up); later steps still land on t0 + k * d.
    await clock.advance(0.02)
    await clock.advance(10.0)
    await task
    assert done[-1] == round(1000 * 0.0061 * 1e9)
    assert schedule.steps == 1000 and schedule.deadline_ns == done[-1]


def test_a_negative_step_is_refused():
    with pytest.raises(ValueError, match="step duration"):
        DeadlineSchedule(ManualClock()).add(-0.001)


async def test_monotonic_clock_reports_how_late_each_sleep_was():
    seen: list[float] = []
    clock = MonotonicClock(observe_lateness=seen.append)
    assert isinstance(clock, Clock)
    deadline = clock.now_ns() + 2_000_000
    lateness = await clock.sleep_until(deadline)
    assert clock.now_ns() >= deadline
    assert lateness >= 0 and seen == [lateness / 1e9]


async def test_sleep_for_holds_relative_to_now_on_the_manual_clock():
    import asyncio

    from kvtransit.runtime.clock import ManualClock, sleep_for

    clock = ManualClock(start_ns=5_000)
    waiter = asyncio.ensure_future(sleep_for(clock, 0.002))
    await clock.advance(0.001)
    assert not waiter.done()
    await clock.advance(0.001)
    assert await waiter == 0
    assert clock.now_ns() == 5_000 + 2_000_000
