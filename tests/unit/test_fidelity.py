"""The fidelity guard's verdicts and the fixes it suggests."""

from __future__ import annotations

import math

import pytest

from kvtransit.model.judge.fidelity import (
    assess,
    handoff_distribution,
    handoff_gap,
    handoff_within_target,
    kernel_gap,
    lateness_mean,
    lateness_p99,
    link_gap,
    not_measured,
    on_idle_link,
    prescribed_handoff_s,
    timer_gap,
)
from kvtransit.model.scenario import Scenario


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


def test_a_link_that_carried_nothing_is_not_measured_and_not_a_pass():
    gap = link_gap(0.0, 200e6, 0.0625, 1.0)
    assert not gap.ok and math.isnan(gap.measured) and gap.hint.startswith("not measured")


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


def test_timers_without_a_wake_up_are_not_measured_and_not_a_pass():
    assert lateness_p99([]) is None
    gap = timer_gap(None, 0.0, 1.0)
    assert not gap.ok and gap.hint == "not measured: no timer wake-ups"


def test_a_kernel_with_no_bytes_is_not_measured_and_not_a_pass():
    gap = kernel_gap(0.0, 0.0, 0.0625, 1.0)
    assert not gap.ok and gap.hint.startswith("not measured")


def test_one_unmeasured_check_makes_the_run_unfaithful():
    faithful, block = assess({"link": link_gap(1, 1, 1, 1), "stats": not_measured("no stats from decode-0", 0.0)})
    assert not faithful and block["stats"]["hint"] == "not measured: no stats from decode-0"


# --- the hand-off against the model ------------------------------------------------------------------------

def test_a_handoff_finds_the_link_idle_only_when_no_other_is_in_flight():
    intervals = [(0.0, 1.0), (0.5, 1.5), (2.0, 3.0), (3.0, 4.0)]
    assert on_idle_link(intervals) == [True, False, True, True]  # (3, 4) starts as (2, 3) ends
    assert on_idle_link(intervals, channels=2) == [True, True, True, True]


def test_prescription_is_latency_plus_wire_time_on_a_bare_link_and_adds_the_module_in_transit():
    bare = Scenario(codec="none")
    link = bare.link_spec
    assert prescribed_handoff_s(bare, 1e8, 1e8) == pytest.approx(link.latency_s + 1e8 / link.bandwidth_Bps)
    transit = Scenario(codec="freq-keep-k", compress_at="transit")
    decl, module = transit.codec_declaration, transit.module
    compute_s = 1e8 * decl.charged_ops_per_byte / (module.ops_per_byte * link.bandwidth_Bps)
    assert prescribed_handoff_s(transit, 1e8, 5e7) == pytest.approx(
        link.latency_s + module.added_latency_s + max(5e7 / link.bandwidth_Bps, compute_s))
    on_gpu = Scenario(codec="freq-keep-k", compress_at="gpu")
    assert prescribed_handoff_s(on_gpu, 1e8, 5e7) == pytest.approx(link.latency_s + 5e7 / link.bandwidth_Bps)


def test_handoffs_within_two_percent_of_the_model_are_faithful_and_slow_ones_are_not():
    modelled = [0.1] * 9
    assert handoff_gap([0.101] * 9, modelled, dilation=1.0).ok
    slow = handoff_gap([0.103, 0.104, 0.105, 0.11, 0.11, 0.11, 0.12, 0.12, 0.2], modelled, dilation=1.0)
    assert not slow.ok and slow.measured == pytest.approx(0.1) and "--dilation 1.1" in slow.hint
    assert not handoff_gap([0.05] * 9, modelled, dilation=1.0).ok  # faster than the link allows


def test_a_slow_tail_does_not_fail_the_handoff_check_but_shows_in_its_distribution():
    measured, modelled = [0.1] * 8 + [0.5], [0.1] * 9
    assert handoff_gap(measured, modelled, dilation=1.0).ok
    dist = handoff_distribution(measured, modelled, total=12)
    assert dist["idle_handoffs"] == 9 and dist["handoffs"] == 12 and dist["ratio"]["max"] == pytest.approx(5.0)
    assert dist["ratio"]["p50"] == pytest.approx(1.0) and dist["within_target"] == pytest.approx(8 / 9)


def test_no_handoff_on_an_idle_link_is_not_measured():
    gap = handoff_gap([], [], dilation=1.0)
    assert not gap.ok and gap.hint == "not measured: no hand-off found the link idle"
