"""The all-reduce's in-network sum: BF16 streams accumulated in float32, rounded once to BF16."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtransit.kernels import KernelInputError
from kvtransit.kernels.stream_sum import BF16, declaration, ops_per_input_byte, sum_streams
from kvtransit.model.module.budget import MODULE_BUDGETS, Module, Verdict, budget_check

EXAMPLES = settings(max_examples=80, deadline=None)
# Finite values well inside BF16's range (max ≈ 3.4e38), so no partial sum overflows; subnormals included.
LIMIT = float(np.float32(1e30))
values = st.floats(min_value=-LIMIT, max_value=LIMIT, allow_nan=False, width=32)


def streams_of(n_streams: st.SearchStrategy[int], elements: st.SearchStrategy[float] = values):
    return st.tuples(n_streams, st.integers(1, 16)).flatmap(
        lambda nk: st.lists(st.lists(elements, min_size=nk[1], max_size=nk[1]), min_size=nk[0], max_size=nk[0])
    ).map(lambda rows: [np.array(row, dtype=np.float32).astype(BF16) for row in rows])


def _exact(streams) -> np.ndarray:
    return np.sum([s.astype(np.float64) for s in streams], axis=0)


@EXAMPLES
@given(streams_of(st.just(2)))
def test_two_streams_sum_to_the_correctly_rounded_bf16(streams):
    result = sum_streams(streams)
    assert result.dtype == BF16 and result.shape == streams[0].shape
    np.testing.assert_array_equal(result, _exact(streams).astype(BF16))


@EXAMPLES
@given(streams_of(st.integers(3, 8)))
def test_many_streams_are_within_bf16_rounding_plus_float32_accumulation(streams):
    n = len(streams)
    exact = _exact(streams)
    magnitude = np.sum([np.abs(s.astype(np.float64)) for s in streams], axis=0)
    result = sum_streams(streams).astype(np.float64)
    # ½ BF16 ulp of the result (≤ 2^−8·|result|, or 2^−134 among subnormals) + (N−1)·2^−24·Σ|x| from float32.
    bound = 2.0**-8 * np.abs(result) + n * 2.0**-24 * magnitude + 2.0**-133
    assert (np.abs(result - exact) <= bound).all()


@EXAMPLES
@given(streams_of(st.just(2)))
def test_two_streams_commute_exactly(streams):
    a, b = streams
    np.testing.assert_array_equal(sum_streams([a, b]), sum_streams([b, a]))


# BF16 values k·2^e with |k| < 256 and e in 8 binades: every partial sum of ≤ 8 of them is a multiple of 2^−8
# below 2^19, exact in float32, so no order can change the result.
narrow = st.builds(lambda k, e: float(k) * 2.0**e, st.integers(-255, 255), st.integers(-8, -1))


@EXAMPLES
@given(streams_of(st.integers(3, 5), narrow), st.randoms(use_true_random=False))
def test_order_does_not_matter_when_float32_holds_every_partial_sum(streams, rnd):
    order = list(range(len(streams)))
    rnd.shuffle(order)
    np.testing.assert_array_equal(sum_streams(streams), sum_streams([streams[i] for i in order]))
    np.testing.assert_array_equal(sum_streams(streams), _exact(streams).astype(BF16))


def test_order_can_matter_for_three_streams_because_float32_rounds_partial_sums():
    big, one, minus_big = (np.array([v], dtype=np.float32).astype(BF16) for v in (2.0**24, 1.0, -(2.0**24)))
    # 2^24 + 1 rounds to 2^24 in float32 (ties to even), so the 1 is lost in one order and kept in the other.
    assert sum_streams([big, one, minus_big]).tolist() == [0.0]
    assert sum_streams([big, minus_big, one]).tolist() == [1.0]
    results = {tuple(sum_streams(list(p)).tolist()) for p in itertools.permutations([big, one, minus_big])}
    assert results == {(0.0,), (1.0,)}


def test_the_one_rounding_is_to_nearest_ties_to_even():
    ones = np.ones(3, dtype=np.float32).astype(BF16)
    # 1 + 2^−8 is halfway between BF16 neighbours 1 and 1 + 2^−7: ties to even gives 1; 1 + 3·2^−8 → 1 + 2^−6;
    # 1 + 2^−8 + 2^−15 (exact in float32) is just above the tie, so it rounds up: the sticky bit survived.
    halves = np.array([2.0**-8, 3 * 2.0**-8, 2.0**-8 + 2.0**-15], dtype=np.float32).astype(BF16)
    assert sum_streams([ones, halves]).astype(np.float32).tolist() == [1.0, 1 + 2.0**-6, 1 + 2.0**-7]


def test_inputs_are_left_alone_and_the_result_is_new():
    a = np.arange(6, dtype=np.float32).reshape(2, 3).astype(BF16)
    b = a.copy()
    result = sum_streams([a, b])
    np.testing.assert_array_equal(a, b)
    assert result.flags.c_contiguous and not np.shares_memory(result, a)
    np.testing.assert_array_equal(result, (2 * np.arange(6, dtype=np.float32)).reshape(2, 3).astype(BF16))


def test_nan_and_inf_propagate_like_ieee_arithmetic():
    a = np.array([np.nan, np.inf, 3e38], dtype=np.float32).astype(BF16)
    b = np.array([1.0, 1.0, 3e38], dtype=np.float32).astype(BF16)
    result = sum_streams([a, b]).astype(np.float32)
    assert np.isnan(result[0]) and result[1] == np.inf and result[2] == np.inf


@pytest.mark.parametrize(
    "streams,message",
    [
        ([], "at least 2 streams, got 0"),
        ([np.zeros(4, dtype=BF16)], "at least 2 streams, got 1"),
        ([np.zeros(4, dtype=BF16), [0.0] * 4], "stream 1 must be a numpy array, got list"),
        ([np.zeros(4, dtype=BF16), np.zeros(4, dtype=np.float32)], "stream 1 has dtype float32"),
        ([np.zeros(4, dtype=np.float16), np.zeros(4, dtype=BF16)], "stream 0 has dtype float16"),
        ([np.zeros(4, dtype=BF16)] * 2 + [np.zeros((2, 2), dtype=BF16)],
         r"stream 2 has shape \(2, 2\), stream 0 has \(4,\)"),
    ],
)
def test_mismatched_or_too_few_streams_are_refused(streams, message):
    with pytest.raises(KernelInputError, match=message):
        sum_streams(streams)


def test_cost_is_half_an_op_per_byte_of_one_stream_and_less_per_input_byte():
    # docs/reference.md §5: two streams = 0.50 op/B, i.e. one add per 2-byte value of one stream; across both
    # streams' bytes it is 0.25, and (N−1)/(2N) for N streams, approaching 0.50 from below.
    assert ops_per_input_byte(2) == 0.25
    assert ops_per_input_byte(8) == pytest.approx(7 / 16)
    assert declaration(8).ops_per_byte == 0.50 >= ops_per_input_byte(8)
    with pytest.raises(KernelInputError, match="at least 2 streams"):
        declaration(1)


def test_the_sum_needs_a_switch_and_fits_the_high_budget_only():
    decl = declaration()
    assert decl.placement == "switch" and decl.in_published_set and decl.ratio == 2.0
    assert budget_check(decl, Module(ops_per_byte=MODULE_BUDGETS["high"])).fits
    assert budget_check(decl, Module(ops_per_byte=MODULE_BUDGETS["low"])).verdict is Verdict.TRANSIT_BOUND
