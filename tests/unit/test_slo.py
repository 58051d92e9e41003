"""Per-request latencies, SLO and the run summary (docs/reference.md §4 definitions), against hand-computed cases."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.slo import (
    TPOT_SLO_S,
    TTFT_SLO_S,
    Outcome,
    RequestRecord,
    distribution,
    kv_wait_share,
    percentile,
    steady_window,
    summarise,
)


def rec(rid, arrival, times, output=None, kv_ready=None, **kw):
    return RequestRecord(rid, arrival, 100, output if output is not None else len(times), list(times), kv_ready, **kw)


def test_latencies_of_one_request_by_hand():
    r = rec(0, 1.0, [1.5, 1.6, 1.62, 1.7], kv_ready=1.55)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.tpot_s == pytest.approx((1.7 - 1.5) / 3)
    assert r.itl_s == pytest.approx([0.1, 0.02, 0.08])
    assert r.e2e_s == pytest.approx(0.7)
    assert r.handoff_s == pytest.approx(0.05)


def test_tpot_is_none_for_a_single_token_and_slo_then_rests_on_ttft():
    r = rec(0, 0.0, [0.9], output=1)
    assert r.tpot_s is None and r.slo_met and r.outcome is Outcome.OK
    assert not rec(1, 0.0, [1.0001], output=1).slo_met


def test_slo_thresholds_are_inclusive_and_the_references():
    assert (TTFT_SLO_S, TPOT_SLO_S) == (1.0, 0.025)
    on_the_line = rec(0, 0.0, [1.0, 1.025])
    assert on_the_line.slo_met
    assert rec(1, 0.0, [1.0, 1.0251]).outcome is Outcome.SLO_MISS


def test_outcomes_failed_and_timed_out():
    assert rec(0, 0.0, [0.1], output=5, failure="checksum").outcome is Outcome.FAILED
    assert rec(1, 0.0, [0.1], output=5).outcome is Outcome.TIMED_OUT


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(q):
    rng = random.Random(q)
    values = [rng.lognormvariate(0, 1) for _ in range(37)]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_by_hand_and_edges():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 99) == 10
    assert math.isnan(percentile([], 50))
    with pytest.raises(ConfigError):
        percentile([1], 101)


def test_distribution_keys_and_empty():
    d = distribution([1.0, 2.0, 3.0, 4.0])
    assert d == {"mean": 2.5, "p50": 2.5, "p90": pytest.approx(3.7), "p99": pytest.approx(3.97), "max": 4.0}
    assert all(math.isnan(v) for v in distribution([]).values())


def test_steady_window_drops_first_tenth_by_arrival():
    records = [rec(i, float(20 - i), [21.0]) for i in range(20)]  # arrive in reverse id order
    steady = steady_window(records)
    assert len(steady) == 18
    assert {r.request_id for r in steady} == set(range(18))  # ids 18, 19 arrived first


def test_summary_by_hand():
    records = [
        rec(0, 0.0, [0.2, 0.21, 0.22], kv_ready=0.205),  # warm-up: dropped from latency summaries
        rec(1, 1.0, [1.1, 1.12, 1.14], kv_ready=1.11),  # met: ttft .1, tpot .02
        rec(2, 2.0, [3.5, 3.51], kv_ready=3.505),  # ttft 1.5: missed
        rec(3, 3.0, [3.1, 3.15], kv_ready=3.12),  # tpot .05: missed
        rec(4, 4.0, [4.1], output=3, failure="checksum mismatch"),
        rec(5, 5.0, [5.1, 5.11], kv_ready=5.105),  # met
        rec(6, 6.0, [6.1], output=2),  # timed out
        rec(7, 7.0, [7.1, 7.12]),  # met
        rec(8, 8.0, [8.1, 8.12]),  # met
        rec(9, 9.0, [9.1, 9.12]),  # met
    ]
    s = summarise(records)
    assert s.requests == {"total": 10, "ok": 6, "slo_miss": 2, "failed": 1, "timed_out": 1,
                          "failed_reasons": {"checksum mismatch": 1}, "measured": 9}
    assert s.slo_attainment == pytest.approx(5 / 9)  # failed and timed-out count as not met
    assert s.goodput_rps == pytest.approx(5 / (9.0 - 1.0))
    assert s.ttft_s["max"] == pytest.approx(1.5)
    assert s.ttft_s["mean"] == pytest.approx((0.1 + 1.5 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1) / 7)
    assert s.tpot_s["max"] == pytest.approx(0.05)
    # hand-off over all requests, warm-up included
    assert s.handoff_s["mean"] == pytest.approx((0.005 + 0.01 + 0.005 + 0.02 + 0.005) / 5)
    assert set(s.as_dict()) == {"ttft_s", "tpot_s", "itl_s", "e2e_s", "handoff_s", "slo_attainment",
                                "goodput_rps", "requests"}


def test_summary_of_nothing_is_nan_not_a_crash():
    s = summarise([])
    assert math.isnan(s.slo_attainment) and math.isnan(s.goodput_rps) and s.requests["total"] == 0


def test_handoff_prefers_the_producers_first_token_stamp():
    r = rec(0, 0.0, [0.100, 0.2], kv_ready=0.150)
    assert r.handoff_s == pytest.approx(0.050)
    r.first_token_stamp_s = 0.098  # prefill stamped it 2 ms before the client received it
    assert r.handoff_s == pytest.approx(0.052)


def test_kv_wait_share_is_the_mean_of_each_requests_hand_off_plus_decode_wait_over_e2e():
    # By hand, arrivals 0..3 (no warm-up cut with warmup_fraction=0):
    #   r0: E2E 1.0, hand-off 0.15 - 0.10 = 0.05, decode wait 0.05 → 0.10 / 1.0 = 0.10
    #   r1: E2E 0.5, hand-off 0.20 - 0.10 = 0.10 (prefill's stamp), decode wait 0.15 → 0.25 / 0.5 = 0.50
    #   r2: decode's wait unknown (its decode restarted): left out
    #   r3: one output token: over at its first token, the hand-off is outside its E2E: left out
    r0 = rec(0, 0.0, [0.10, 1.00], kv_ready=0.15, decode_wait_s=0.05)
    r1 = rec(1, 1.0, [1.12, 1.50], kv_ready=1.20, decode_wait_s=0.15, first_token_stamp_s=1.10)
    r2 = rec(2, 2.0, [2.10, 2.80], kv_ready=2.20)
    r3 = rec(3, 3.0, [3.10], kv_ready=3.20, decode_wait_s=0.0)
    assert r0.kv_wait_share == pytest.approx(0.10) and r1.kv_wait_share == pytest.approx(0.50)
    assert r2.kv_wait_s is None and r2.kv_wait_share is None and r3.kv_wait_share is None
    assert kv_wait_share([r0, r1, r2, r3], warmup_fraction=0.0) == pytest.approx((0.10 + 0.50) / 2)


def test_kv_wait_share_counts_the_steady_window_only_and_is_nan_without_a_figure():
    warm = rec(0, 0.0, [0.1, 1.0], kv_ready=0.5, decode_wait_s=0.4)  # 0.8: the warm-up request, left out
    steady = [rec(i, float(i), [i + 0.1, i + 1.0], kv_ready=i + 0.2, decode_wait_s=0.0) for i in range(1, 10)]
    assert kv_wait_share([warm, *steady]) == pytest.approx(0.1 / 1.0)
    assert math.isnan(kv_wait_share([rec(0, 0.0, [0.1, 1.0], kv_ready=0.2)]))
    failed = rec(1, 0.0, [0.1], output=5, kv_ready=0.2, decode_wait_s=0.1, failure="lost")
    assert failed.kv_wait_share is None  # no E2E: it never finished
