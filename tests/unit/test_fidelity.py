"""The fidelity guard's verdicts and the fixes it suggests."""

from __future__ import annotations

import math

import pytest

from kvtransit.model.fidelity import (
    assess,
    handoff_within_target,
    kernel_gap,
    lateness_mean,
    lateness_p99,
    link_gap,
    timer_gap,
)


def test_timer_lateness_within_three_percent_of_shortest_step_is_faithful():
    gap = timer_gap(lateness_mean([0.0001] * 100), shortest_step_wall_s=0.0062, dilation=1.0)
    assert gap.ok and gap.measured == pytest.approx(0.0001 / 0.0062)


def test_late_timers_suggest_a_dilation_that_would_fix_them():
    # 6 % late: twice the target.
    gap = timer_gap(lateness_mean([0.0006] * 100), shortest_step_wall_s=0.01, dilation=1.0)
    assert not gap.ok and "--dilation 2" in gap.hint


def test_a_few_slow_wake_ups_do_not_make_a_run_unfaithful_but_a_late_habit_does():
    """Absolute deadlines: a late wake-up shifts its own token only, so the mean is judged, not the p99."""
    two_spikes = [0.00002] * 98 + [0.004] * 2
    assert lateness_p99(two_spikes) > 0.001
    assert timer_gap(lateness_mean(two_spikes), shortest_step_wall_s=0.0062, dilation=1.0).ok
    assert not timer_gap(lateness_mean([0.0004] * 100), shortest_step_wall_s=0.0062, dilation=1.0).ok


def test_slow_link_suggests_smaller_scale():
    gap = link_gap(achieved_Bps=100e6, configured_Bps=200e6, scale=0.0625, dilation=1.0)
    assert not gap.ok and gap.measured == pytest.approx(0.5) and "--scale 0.03" in gap.hint
    assert link_gap(199e6, 200e6, 0.0625, 1.0).ok
    assert link_gap(0.0, 200e6, 0.0625, 1.0).ok and math.isnan(link_gap(0.0, 200e6, 0.0625, 1.0).measured)


def test_kernel_slower_than_its_modelled_time_is_flagged():
    assert kernel_gap(0.5, 1.0, 0.0625, 1.0).ok
    slow = kernel_gap(3.0, 1.0, 0.0625, 1.0)
    assert not slow.ok and "--dilation 3" in slow.hint


def test_assess_is_faithful_only_when_every_gap_is():
    good, bad = link_gap(1, 1, 1, 1), kernel_gap(2, 1, 1, 1)
    faithful, report = assess({"link": good, "kernel": bad})
    assert not faithful and set(report["kernel"]) == {"measured", "target", "ok", "hint"}
    assert assess({"link": good})[0]


def test_handoff_target_is_two_percent_or_one_millisecond():
    assert handoff_within_target(0.0859 * 1.019, 0.0859)
    assert not handoff_within_target(0.0859 * 1.03, 0.0859)
    assert handoff_within_target(0.0015, 0.001)  # 1 ms absolute floor


def test_no_timed_steps_is_not_a_gap():
    assert lateness_p99([]) is None and timer_gap(None, 0.0, 1.0).ok
