"""ML-KEM's NTT polynomial multiplication (FIPS 203 §4.3): exact against the schoolbook product and the
standard's own definition, invertible, linear, and strict about its input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kvtransit.kernels import KernelInputError
from kvtransit.kernels import ntt as kem
from kvtransit.model.module.budget import MODULE_BUDGETS, Module, Verdict, budget_check

Q, N = kem.Q, kem.N
EXAMPLES = settings(max_examples=60, deadline=None)


def polys(batch: tuple[int, ...] = ()) -> st.SearchStrategy[np.ndarray]:
    return arrays(np.int64, (*batch, N), elements=st.integers(0, Q - 1))


batched_polys = st.sampled_from([(), (1,), (3,), (2, 2)]).flatmap(polys)
scalars = st.integers(0, Q - 1)


def test_fips203_constants_hold():
    assert pow(kem.ZETA, 128, Q) == Q - 1  # ζ = 17 is a primitive 256th root of unity mod q
    assert (128 * kem.INV_128) % Q == 1
    assert kem.ENCODED_POLY_BYTES == 384


def test_zeta_tables_match_fips203_appendix_a():
    # The first and last rows of FIPS 203 Appendix A's two tables, as printed there.
    assert kem.ZETAS[:8].tolist() == [1, 1729, 2580, 3289, 2642, 630, 1897, 848]
    assert kem.ZETAS[-8:].tolist() == [1722, 1212, 1874, 1029, 2110, 2935, 885, 2154]
    assert kem.GAMMAS[:8].tolist() == [17, 3312, 2761, 568, 583, 2746, 2649, 680]
    assert kem.GAMMAS[-4:].tolist() == [885, 2444, 2154, 1175]


def _ntt_by_definition(f: np.ndarray) -> np.ndarray:
    """FIPS 203 eq. (4.9): f̂[2i] = Σ_j f[2j]·ζ^((2·BitRev7(i)+1)·j), likewise for the odd coefficients."""
    exponents = np.array([[(2 * kem._bit_rev7(i) + 1) * j % N for j in range(N // 2)] for i in range(N // 2)])
    powers = np.array([pow(kem.ZETA, int(e), Q) for e in range(N)], dtype=np.int64)[exponents]
    out = np.empty(N, dtype=np.int64)
    out[0::2] = powers @ f[0::2] % Q
    out[1::2] = powers @ f[1::2] % Q
    return out


@EXAMPLES
@given(polys())
def test_ntt_equals_fips203_definition_coefficient_for_coefficient(f):
    np.testing.assert_array_equal(kem.ntt(f), _ntt_by_definition(f))


@EXAMPLES
@given(batched_polys, polys())
def test_multiply_equals_schoolbook_product(a, b):
    product = kem.multiply(a, b)
    assert product.shape == a.shape and product.dtype == np.int64
    np.testing.assert_array_equal(product, kem.schoolbook_multiply(a, b))


def test_multiply_is_exact_at_the_largest_coefficients():
    top = np.full((2, N), Q - 1)
    np.testing.assert_array_equal(kem.multiply(top, top), kem.schoolbook_multiply(top, top))


def test_multiply_broadcasts_a_matrix_against_a_vector():
    rng = np.random.default_rng(3)
    matrix, vector = rng.integers(0, Q, (3, 3, N)), rng.integers(0, Q, (3, N))
    np.testing.assert_array_equal(kem.multiply(matrix, vector), kem.schoolbook_multiply(matrix, vector))


@EXAMPLES
@given(batched_polys)
def test_intt_inverts_ntt(f):
    np.testing.assert_array_equal(kem.intt(kem.ntt(f)), f)
    np.testing.assert_array_equal(kem.ntt(kem.intt(f)), f)


@EXAMPLES
@given(polys(), polys(), scalars)
def test_ntt_is_linear(a, b, c):
    np.testing.assert_array_equal(kem.ntt((a + b) % Q), (kem.ntt(a) + kem.ntt(b)) % Q)
    np.testing.assert_array_equal(kem.ntt(c * a % Q), c * kem.ntt(a) % Q)


@EXAMPLES
@given(polys())
def test_multiplying_by_one_changes_nothing(a):
    one = np.zeros(N, dtype=np.int64)
    one[0] = 1
    np.testing.assert_array_equal(kem.multiply(a, one), a)


@EXAMPLES
@given(polys())
def test_multiplying_by_x_shifts_and_negates_the_wrapped_coefficient(a):
    x = np.zeros(N, dtype=np.int64)
    x[1] = 1
    shifted = np.roll(a, 1)
    shifted[0] = (-a[-1]) % Q  # X^256 ≡ −1
    np.testing.assert_array_equal(kem.multiply(a, x), shifted)


def test_multiply_ntts_is_pointwise_in_the_ntt_domain():
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, Q, (2, N)), rng.integers(0, Q, (2, N))
    np.testing.assert_array_equal(kem.intt(kem.multiply_ntts(kem.ntt(a), kem.ntt(b))), kem.multiply(a, b))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint64])
def test_any_integer_dtype_in_range_is_taken(dtype):
    f = np.arange(N, dtype=dtype) * 13 % Q
    np.testing.assert_array_equal(kem.ntt(f), kem.ntt(f.astype(np.int64)))


def test_a_strided_view_transforms_like_its_copy():
    f = np.random.default_rng(5).integers(0, Q, (N, 4))
    np.testing.assert_array_equal(kem.ntt(f.T), kem.ntt(np.ascontiguousarray(f.T)))


def test_ntt_leaves_its_input_alone():
    f = np.random.default_rng(6).integers(0, Q, (2, N))
    before = f.copy()
    kem.multiply(f, f)
    kem.intt(kem.ntt(f))
    np.testing.assert_array_equal(f, before)


@pytest.mark.parametrize(
    "bad,message",
    [
        ([0] * N, "must be a numpy array"),
        (np.zeros(N, dtype=np.float64), "integer dtype"),
        (np.zeros(N, dtype=bool), "integer dtype"),
        (np.zeros(N - 1, dtype=np.int64), r"\[\.\.\., 256\] coefficients, got shape \(255,\)"),
        (np.zeros((), dtype=np.int64), r"got shape \(\)"),
        (np.array([0] * (N - 1) + [Q]), r"1 value\(s\) outside 0..3328, first 3329 at index \(255,\)"),
        (np.array([[-1] * N, [0] * N]), r"256 value\(s\) outside 0..3328, first -1 at index \(0, 0\)"),
    ],
)
def test_bad_input_is_refused_by_name(bad, message):
    with pytest.raises(KernelInputError, match=message):
        kem.ntt(bad)
    with pytest.raises(KernelInputError, match=message):
        kem.multiply(np.zeros(N, dtype=np.int64), bad)


def test_batches_that_do_not_broadcast_are_refused():
    with pytest.raises(KernelInputError, match=r"batch shapes \(2,\) and \(3,\) do not broadcast"):
        kem.multiply(np.zeros((2, N), dtype=np.int64), np.zeros((3, N), dtype=np.int64))


def test_op_counts_follow_fips203_algorithms():
    counts = kem.MULTIPLY_OP_COUNTS
    # 3 transforms × 7 layers × 128 butterflies × (1 mul + 2 adds); 128 base cases × 7 ops; 256 scalings.
    assert counts.transform_ops == 3 * 7 * 128 * 3
    assert counts.other_ops == 128 * 7 + 256
    assert counts.total == 9216
    assert counts.ops_per_input_byte() == 12.0
    assert counts.ops_per_input_byte(transform_charged=False) == 1.5


def test_the_multiplication_is_transit_bound_when_the_ntt_is_charged():
    high = Module(ops_per_byte=MODULE_BUDGETS["high"])
    charged = budget_check(kem.declaration(), high)
    assert charged.verdict is Verdict.TRANSIT_BOUND
    assert charged.slowdown == pytest.approx(12.0 / 3.96)
    assert budget_check(kem.declaration(transform_charged=False), high).fits
