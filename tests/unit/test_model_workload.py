"""The request stream reproduces the simulator's draws (docs/reference.md §4) exactly."""

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtransit.model.errors import ConfigError
from kvtransit.model.serving.workload import LengthDist, RequestSpec, WorkloadSpec, generate


def _lognormal_length(rng: random.Random, mean: float, cv: float) -> int:
    """docs/reference.md §4 written out independently of the library."""
    sigma2 = math.log(1 + cv**2)
    mu = math.log(mean) - sigma2 / 2
    return int(min(32768, max(1, round(rng.lognormvariate(mu, math.sqrt(sigma2))))))


def test_first_five_requests_of_seed_1_match_the_formula_drawn_independently():
    rate = 8.0
    rng = random.Random(1)
    expected, t = [], 0.0
    for i in range(5):
        t += rng.expovariate(rate)
        prompt = _lognormal_length(rng, 2048, 0.5)
        output = _lognormal_length(rng, 256, 0.5)
        expected.append(RequestSpec(i, t, prompt, output))
    assert generate(WorkloadSpec(rate=rate, requests=5)) == expected
    # The first request's arrival is the seed's first exponential gap, not zero.
    assert expected[0].arrival_s == pytest.approx(random.Random(1).expovariate(rate))


def test_the_default_workload_is_reference_section_4():
    spec = WorkloadSpec(rate=1.0)
    assert (spec.requests, spec.seed, spec.arrival) == (800, 1, "poisson")
    assert (spec.prompt.mean, spec.prompt.cv, spec.output.mean, spec.output.cv) == (2048, 0.5, 256, 0.5)
    assert (spec.prompt.lo, spec.prompt.hi) == (1, 32768)


def test_cv_zero_is_a_fixed_length_and_leaves_the_generator_alone():
    rng = random.Random(7)
    assert LengthDist(300, 0).sample(rng) == 300
    assert rng.random() == random.Random(7).random()


def test_lengths_are_clipped_to_bounds():
    rng = random.Random(3)
    samples = [LengthDist(5000, 3.0, lo=100, hi=6000).sample(rng) for _ in range(500)]
    assert min(samples) == 100 and max(samples) == 6000


def test_gamma_arrivals_draw_gaps_like_vllm_bench_serve():
    spec = WorkloadSpec(rate=4.0, requests=3, arrival="gamma", burstiness=0.5,
                        prompt=LengthDist(10, 0), output=LengthDist(5, 0))
    rng = random.Random(1)
    t, arrivals = 0.0, []
    for _ in range(3):
        t += rng.gammavariate(0.5, 1 / (4.0 * 0.5))
        arrivals.append(t)
    assert [r.arrival_s for r in generate(spec)] == arrivals


def test_gamma_mean_gap_is_one_over_rate():
    requests = generate(WorkloadSpec(rate=10.0, requests=4000, arrival="gamma", burstiness=0.25))
    assert requests[-1].arrival_s / len(requests) == pytest.approx(0.1, rel=0.1)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: WorkloadSpec(rate=0), "request rate must be > 0"),
        (lambda: WorkloadSpec(rate=-2), "request rate must be > 0"),
        (lambda: WorkloadSpec(rate=1, requests=0), "number of requests"),
        (lambda: WorkloadSpec(rate=1, arrival="uniform"), "unknown arrival process 'uniform'"),
        (lambda: WorkloadSpec(rate=1, burstiness=0), "burstiness must be > 0"),
        (lambda: LengthDist(0, 0.5), "length mean must be > 0"),
        (lambda: LengthDist(10, -1), "length cv must be >= 0"),
        (lambda: LengthDist(10, 0.5, lo=20, hi=10), "upper bound"),
    ],
)
def test_bad_workload_values_are_rejected_by_name(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32), rate=st.floats(0.1, 100), arrival=st.sampled_from(["poisson", "gamma"]))
def test_same_seed_same_stream_and_arrivals_never_go_back(seed, rate, arrival):
    spec = WorkloadSpec(rate=rate, requests=20, seed=seed, arrival=arrival)
    first = generate(spec)
    assert first == generate(spec)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(first))
    assert all(1 <= r.prompt_tokens <= 32768 and 1 <= r.output_tokens <= 32768 for r in first)
