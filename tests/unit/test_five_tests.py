"""The five tests (docs/reference.md §8) on made-up measurements: each passes and fails by its rule, a test not measured
fails closed, and a flow without a kernel is "no kernel"."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtransit.model.catalog.codecs import codec_declaration
from kvtransit.model.judge.five_tests import (
    BOTTLENECK_MIN_SHARE,
    CANDIDATE,
    NO_KERNEL,
    TEST_NAMES,
    HandoffMeasured,
    PrecisionMeasured,
    budget_test,
    equal_bytes_baseline,
    judge_handoff,
    placement_test,
    precision_test,
)
from kvtransit.model.module.budget import KernelDeclaration

BAND_KEEP = codec_declaration("freq-keep-k", keep=0.5, transform_length=64)
SIM_BUDGET = 1.6
GOOD_PRECISION = PrecisionMeasured(8, 0.02, 0.025, "fp8", 0.03, 0.03, 1.88)


def measured(**changes) -> HandoffMeasured:
    """A run in which every test passes for BAND_KEEP at the sim budget; `changes` break one thing."""
    base = HandoffMeasured(kv_wait_share=0.25, link_busy=0.6, transit_bound_frames=0, frames_in=640, frames_out=640,
                           precision=GOOD_PRECISION)
    return replace(base, **changes)


def by_name(result) -> dict:
    return {t.test: t for t in result.tests}


def test_a_kernel_passing_all_five_is_a_candidate():
    result = judge_handoff(BAND_KEEP, SIM_BUDGET, measured())
    assert [t.test for t in result.tests] == list(TEST_NAMES)
    assert all(t.passed is True for t in result.tests)
    assert result.verdict == CANDIDATE and result.candidate


def test_bottleneck_fails_below_the_minimum_share_and_names_the_numbers():
    assert pytest.approx(0.10) == BOTTLENECK_MIN_SHARE  # (3 % timer + 2 % hand-off) / (1 - 1/2)
    ok = by_name(judge_handoff(BAND_KEEP, SIM_BUDGET, measured(kv_wait_share=0.10)))["bottleneck"]
    low = by_name(judge_handoff(BAND_KEEP, SIM_BUDGET, measured(kv_wait_share=0.032)))["bottleneck"]
    assert ok.passed is True
    assert low.passed is False and "3.2%" in low.reason and "10.0%" in low.reason and "busy 60.0%" in low.reason
    assert judge_handoff(BAND_KEEP, SIM_BUDGET, measured(kv_wait_share=0.032)).verdict == \
        "not a candidate: bottleneck"


def test_operations_fails_on_an_unpublished_op_and_ignores_wiring():
    fp8 = codec_declaration("fp8")
    tests = by_name(judge_handoff(fp8, SIM_BUDGET, measured(precision=replace(GOOD_PRECISION, k_relative_error=0.03,
                                                                             v_relative_error=0.03))))
    assert tests["operations"].passed is False and "rounding" in tests["operations"].reason
    with_gather = replace(BAND_KEEP, op_types=frozenset({"fft", "gather"}))
    assert by_name(judge_handoff(with_gather, SIM_BUDGET, measured()))["operations"].passed is True


def test_budget_fails_when_ops_per_line_byte_exceed_the_budget():
    # 64-point transform charged: 1.25·log2 64 = 7.5 ops/B x ratio 2 = 15 ops per line byte > 3.96.
    charged = replace(BAND_KEEP, transform_charged=True)
    result = budget_test(charged, 3.96, transit_bound_frames=640, frames=640)
    assert result.passed is False
    assert "7.50 ops/B (transform charged) x ratio 2 = 15.00 ops per line byte > budget 3.96" in result.reason
    assert "640 of 640 frames transit-bound" in result.reason


def test_budget_counts_ratio_times_charged_ops_against_the_line_rate_budget():
    # 1.0 op per input byte fits a 1.6 budget per input byte but not per line byte at ratio 2 (2.0 > 1.6).
    decl = KernelDeclaration("mac-half", ratio=2.0, ops_per_byte=1.0, op_types=frozenset({"mac"}))
    assert budget_test(decl, 1.6, transit_bound_frames=0, frames=10).passed is False
    assert budget_test(decl, 2.0, transit_bound_frames=0, frames=10).passed is True


def test_budget_fails_when_the_middlebox_measured_transit_bound_frames():
    result = budget_test(BAND_KEEP, SIM_BUDGET, transit_bound_frames=3, frames=640)
    assert result.passed is False and "3 of 640 frames transit-bound" in result.reason


def test_precision_fails_when_the_kernel_is_worse_than_its_equal_bytes_baseline_on_k_or_v():
    worse_v = replace(GOOD_PRECISION, v_relative_error=0.57)
    result = precision_test(BAND_KEEP, worse_v)
    assert result.passed is False and "V 0.57 > 0.03" in result.reason and "K " not in result.reason.split("worse")[1]
    assert precision_test(BAND_KEEP, GOOD_PRECISION).passed is True


def test_a_lossless_kernel_passes_precision_only_with_zero_error():
    lossless = KernelDeclaration("ntt-identity", ratio=1.0, op_types=frozenset({"ntt"}), transform="ntt",
                                 transform_length=256, lossless=True)
    exact = PrecisionMeasured(4, 0.0, 0.0)  # no baseline needed
    assert precision_test(lossless, exact).passed is True
    assert precision_test(lossless, replace(exact, v_relative_error=1e-9)).passed is False


def test_equal_bytes_baseline_is_the_nearest_quantiser_by_ratio():
    assert equal_bytes_baseline(2.0) == "fp8"
    assert equal_bytes_baseline(64 / 17) == "fp4-block"
    assert equal_bytes_baseline(4.0) == "fp4-block"
    assert equal_bytes_baseline(1.5) == "fp8"
    assert equal_bytes_baseline(2.7) == "fp8" and equal_bytes_baseline(2.8) == "fp4-block"  # √(2 · 3.765) = 2.74


def test_placement_fails_for_a_sum_on_a_pluggable_and_passes_on_a_switch():
    summing = KernelDeclaration("sum-2", ops_per_byte=0.5, op_types=frozenset({"float"}), streams=2,
                                placement="switch")
    assert placement_test(summing, 2.0, measured_as="frames in per frame out").passed is True
    one_stream = replace(BAND_KEEP, placement="pluggable")
    assert placement_test(one_stream, 1.0, measured_as="x").passed is True
    assert placement_test(one_stream, 2.0, measured_as="x").passed is False  # measured: two streams per hand-off


@pytest.mark.parametrize("broken, test", [
    (dict(kv_wait_share=None), "bottleneck"),
    (dict(transit_bound_frames=None, frames_in=None, frames_out=None), "budget"),
    (dict(precision=PrecisionMeasured(0, None, None)), "precision"),
    (dict(precision=replace(GOOD_PRECISION, baseline_codec=None, baseline_k_relative_error=None,
                            baseline_v_relative_error=None)), "precision"),
    (dict(frames_in=None, frames_out=None, transit_bound_frames=0), "placement"),
])
def test_a_test_not_measured_fails_closed(broken, test):
    result = judge_handoff(BAND_KEEP, SIM_BUDGET, measured(**broken))
    judged = by_name(result)[test]
    assert judged.passed is None and judged.reason.startswith("not measured: ")
    assert not result.candidate and f"{test} (not measured)" in result.verdict


def test_no_kernel_on_the_link_is_no_kernel_not_a_failure():
    result = judge_handoff(None, SIM_BUDGET, measured(kv_wait_share=0.03), no_kernel_reason="no kernel on this link")
    assert result.verdict == NO_KERNEL and not result.candidate and result.kernel is None
    tests = by_name(result)
    assert all(tests[name].passed is None and tests[name].reason == "no kernel on this link"
               for name in TEST_NAMES[1:])
    # The flow's share is still measured: it says whether a kernel here could matter at all.
    assert tests["bottleneck"].passed is False and "no kernel on this link" in tests["bottleneck"].reason


def test_the_verdict_is_json_ready_with_every_field():
    block = judge_handoff(BAND_KEEP, SIM_BUDGET, measured(kv_wait_share=0.01)).as_dict()
    assert block["verdict"] == "not a candidate: bottleneck" and block["candidate"] is False
    assert set(block["tests"][0]) == {"test", "passed", "measured", "target", "reason", "values"}
