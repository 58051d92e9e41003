"""TokenBucket and DelayLine arithmetic with a fake clock (plain numbers)."""

from __future__ import annotations

import statistics

import pytest

from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.userspace import DelayLine, TokenBucket


def test_bytes_within_the_burst_leave_at_once():
    bucket = TokenBucket(rate_Bps=1000.0, burst_bytes=500)
    assert bucket.reserve(500, now=10.0) == 10.0


def test_a_large_write_is_paced_by_its_debt():
    bucket = TokenBucket(rate_Bps=1000.0, burst_bytes=0)
    assert bucket.reserve(2500, now=0.0) == pytest.approx(2.5)


def test_departures_are_fifo_and_add_up_to_the_rate():
    bucket = TokenBucket(rate_Bps=1e6, burst_bytes=0)
    times = [bucket.reserve(1000, now=0.0) for _ in range(10)]
    assert times == sorted(times)
    assert times[-1] == pytest.approx(10 * 1000 / 1e6)


def test_idle_time_refills_up_to_the_burst_only():
    bucket = TokenBucket(rate_Bps=100.0, burst_bytes=200)
    bucket.reserve(200, now=0.0)
    # 100 s idle would mint 10,000 bytes, but the bucket holds 200: the 201st byte waits 1/100 s.
    assert bucket.reserve(201, now=100.0) == pytest.approx(100.01)


def test_set_rate_pays_the_remaining_debt_at_the_new_rate():
    bucket = TokenBucket(rate_Bps=1000.0, burst_bytes=0)
    bucket.reserve(2000, now=0.0)  # 2 s of debt at 1000 B/s
    bucket.set_rate(2000.0, now=1.0)  # 1000 B paid by t=1, 1000 B left at 2000 B/s -> 0.5 s
    assert bucket.reserve(0, now=1.0) == pytest.approx(1.5)


def test_a_clock_stepping_back_never_mints_tokens():
    bucket = TokenBucket(rate_Bps=1000.0, burst_bytes=0)
    first = bucket.reserve(1000, now=5.0)
    assert bucket.reserve(1000, now=4.0) == pytest.approx(first + 1.0)


@pytest.mark.parametrize("kwargs,field", [
    ({"rate_Bps": 0.0, "burst_bytes": 1}, "rate_Bps"), ({"rate_Bps": -5.0, "burst_bytes": 1}, "rate_Bps"),
    ({"rate_Bps": 1.0, "burst_bytes": -1}, "burst_bytes"),
])
def test_bad_bucket_parameters_are_refused(kwargs, field):
    with pytest.raises(ShapingError) as info:
        TokenBucket(**kwargs)
    assert info.value.field == field


def test_delay_line_without_jitter_adds_exactly_the_latency():
    line = DelayLine(0.005)
    assert [line.release_time(t) for t in (0.0, 1.0, 1.001)] == pytest.approx([0.005, 1.005, 1.006])


@pytest.mark.parametrize("distribution", ["normal", "uniform", "pareto", "paretonormal"])
def test_jittered_release_times_never_reorder(distribution):
    line = DelayLine(0.010, jitter_s=0.005, distribution=distribution, seed=3)
    releases = [line.release_time(i * 0.0001) for i in range(2000)]
    assert releases == sorted(releases)
    assert all(r >= i * 0.0001 for i, r in enumerate(releases))


@pytest.mark.parametrize("distribution", ["normal", "uniform", "pareto"])
def test_sparse_traffic_sees_the_mean_latency(distribution):
    # Sent 1 s apart, no chunk waits for another: the delay averages the latency (jitter has mean 0).
    line = DelayLine(0.020, jitter_s=0.002, distribution=distribution, seed=1)
    delays = [line.release_time(float(i)) - i for i in range(4000)]
    assert statistics.fmean(delays) == pytest.approx(0.020, abs=2e-4)
    assert statistics.pstdev(delays) == pytest.approx(0.002 if distribution != "uniform" else 0.002 / 3**0.5,
                                                      rel=0.15)


def test_same_seed_same_delays():
    a, b = DelayLine(0.01, 0.003, seed=7), DelayLine(0.01, 0.003, seed=7)
    assert [a.release_time(i) for i in range(50)] == [b.release_time(i) for i in range(50)]


def test_bad_delay_parameters_are_refused():
    with pytest.raises(ShapingError, match="latency_s=-1"):
        DelayLine(-1)
    with pytest.raises(ShapingError, match="distribution='gamma'"):
        DelayLine(0.01, 0.001, distribution="gamma")
