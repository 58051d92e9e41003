"""Time-varying links: schedule text, Mahimahi traces, and playing a schedule on a fake clock."""

from __future__ import annotations

import pytest

from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.schedule import Schedule, Step, parse_mahimahi, parse_schedule, play


def test_schedule_text_parses_units_and_comments():
    schedule = parse_schedule("# t rate latency loss\n0 200mbit 5ms 0\n2.5s, 50mbit, 20ms, 1%\n")
    assert schedule.steps == (Step(0.0, 25e6, 0.005, 0.0), Step(2.5, 6.25e6, 0.02, 1.0))
    assert schedule.at(1.0).rate_Bps == 25e6
    assert schedule.at(3.0).latency_s == 0.02


@pytest.mark.parametrize("text,match", [
    ("1 200mbit\n", "first step must start at t=0"),
    ("0 200mbit\n0 100mbit\n", "must increase"),
    ("0 200\n", "rate"),
    ("0 200mbit 5ms 150\n", "loss_pct"),
    ("0\n", "line 1"),
])
def test_bad_schedules_are_refused_with_the_line(text, match):
    with pytest.raises(ShapingError, match=match):
        parse_schedule(text)


def test_mahimahi_trace_bins_delivery_opportunities_into_rates():
    # 3 packets in the first 100 ms, none in the second, 2 in the third (250 ms, and 300 ms, the trace's end,
    # which mm-link delivers before looping): 1500 B each.
    schedule = parse_mahimahi("10\n20\n30\n250\n300\n", bin_s=0.1)
    rates = [s.rate_Bps for s in schedule.steps]
    assert rates == pytest.approx([3 * 1500 / 0.1, 1.0, 2 * 1500 / 0.1])
    assert schedule.period_s == pytest.approx(0.3)
    assert schedule.at(0.35).rate_Bps == pytest.approx(45_000)  # the trace loops


def test_mahimahi_trace_must_be_non_decreasing_integers():
    with pytest.raises(ShapingError, match="line 2"):
        parse_mahimahi("10\n5\n")
    with pytest.raises(ShapingError, match="line 1"):
        parse_mahimahi("ten\n")


def test_play_applies_each_step_at_its_absolute_time():
    now = [0.0]
    applied = []
    schedule = Schedule((Step(0.0, 1e6), Step(1.0, 2e6), Step(2.5, 3e6)))

    def sleep(seconds):
        now[0] += seconds + 0.001  # a late timer: absolute deadlines keep the error from piling up

    count = play(schedule, lambda step: applied.append((round(now[0], 3), step.rate_Bps)), duration_s=4.0,
                 clock=lambda: now[0], sleep=sleep)
    assert count == 3
    assert applied == [(0.0, 1e6), (1.001, 2e6), (2.501, 3e6)]
