"""ML-KEM's polynomial multiplication by number-theoretic transform (docs/reference.md §7: "ML-KEM-768: polynomials of
degree 256 mod 3,329 multiplied via NTTs"), exactly as FIPS 203 §4.3 specifies it, vectorised over numpy.

    f_hat = ntt(f)                  # FIPS 203 Algorithm 9,  f [..., 256] ints in 0..q-1
    f = intt(f_hat)                 # FIPS 203 Algorithm 10
    h_hat = multiply_ntts(f_hat, g_hat)     # Algorithms 11 + 12 (BaseCaseMultiply), in the NTT domain
    h = multiply(f, g)              # f·g mod (X^256 + 1, q) = intt(multiply_ntts(ntt(f), ntt(g)))
    h = schoolbook_multiply(f, g)   # the O(n²) negacyclic convolution the tests check `multiply` against

Not cryptography: no sampling, keys or encapsulation (ML-KEM itself would come from a maintained library).
This is the arithmetic the module would run on a ciphertext flow, for its operation count
(`MULTIPLY_OP_COUNTS`, `declaration`) and an exactness check.

ML-KEM's NTT is *incomplete*: q − 1 = 3328 = 2^8 · 13 has 256th but no 512th roots of unity, so X^256 + 1
splits only into 128 degree-2 factors X² − ζ^(2·BitRev7(i)+1) (FIPS 203 §4.3). Seven layers of butterflies
take f to its 128 residues (pairs of coefficients), products are degree-1 × degree-1 mod those factors
(BaseCaseMultiply), and seven inverse layers plus a scale by 128⁻¹ come back. Outputs are in bit-reversed
pair order, as FIPS 203 defines them (eq. 4.9/4.10), so `ntt` matches the standard coefficient for
coefficient.

Exactness: every value is an int64 and every step is arithmetic in Z_q, reduced lazily but always inside
int64 (bounds at each loop); reduction mod q is a ring homomorphism, so reducing later gives the same
residue as FIPS 203's reduce-every-step. Each butterfly brings its product (ζ·x, the one term that could
grow multiplicatively) back to [−q, 2q) by Barrett reduction; sums are reduced once, exactly, at the end
of a transform.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvtransit.kernels.errors import KernelInputError
from kvtransit.model.module.budget import KernelDeclaration

Q = 3329  # FIPS 203 §2.4 ("q := 3329") and §4.3: the modulus, a prime with q − 1 = 2^8 · 13
N = 256  # FIPS 203 §2.4 ("n := 256"): polynomials of degree < 256 in Z_q[X] / (X^256 + 1)
ZETA = 17  # FIPS 203 §4.3: ζ = 17, a primitive 256th root of unity mod q (17^128 ≡ −1)
INV_128 = 3303  # FIPS 203 Algorithm 10, line 14: "f ← f · 3303 mod q", 3303 = 128⁻¹ mod q (128 · 3303 = 127 · q + 1)
LAYERS = 7  # FIPS 203 Algorithms 9 and 10: len = 128, 64, …, 2 (seven layers; the NTT is incomplete)
# FIPS 203 §4.2.1 ByteEncode_12: a polynomial's 256 coefficients of 12 bits are 384 bytes on the wire.
ENCODED_POLY_BYTES = N * 12 // 8


def _bit_rev7(i: int) -> int:
    """FIPS 203 §2.3 BitRev7: the 7-bit binary expansion of i (0 ≤ i < 128), reversed."""
    return int(f"{i:07b}"[::-1], 2)


# FIPS 203 Appendix A, first table: ζ^BitRev7(i) mod q for i = 0…127 (1, 1729, 2580, 3289, …, 2154), used by
# Algorithms 9 and 10. Computed from ζ and BitRev7 so the table cannot hold a typo; tests pin it against
# the printed appendix.
ZETAS = np.array([pow(ZETA, _bit_rev7(i), Q) for i in range(N // 2)], dtype=np.int64)
# FIPS 203 Appendix A, second table: ζ^(2·BitRev7(i)+1) mod q for i = 0…127 (17, −17, 2761, −2761, …), the
# γ of each degree-2 factor X² − γ, used by Algorithm 11.
GAMMAS = np.array([pow(ZETA, 2 * _bit_rev7(i) + 1, Q) for i in range(N // 2)], dtype=np.int64)


def _check_polys(x: np.ndarray, name: str) -> None:
    """x must be a numpy integer array [..., 256] with every value in 0..q−1 (FIPS 203's Z_q representatives)."""
    if not isinstance(x, np.ndarray):
        raise KernelInputError(f"{name} must be a numpy array of ints in 0..{Q - 1}, got {type(x).__name__}")
    if not np.issubdtype(x.dtype, np.integer):
        raise KernelInputError(f"{name} must have an integer dtype (values in 0..{Q - 1}), got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] != N:
        raise KernelInputError(f"{name} must be [..., {N}] coefficients, got shape {x.shape}")
    if x.size and (int(x.min()) < 0 or int(x.max()) >= Q):
        bad = (x < 0) | (x >= Q)
        first = tuple(int(i) for i in np.unravel_index(int(bad.argmax()), x.shape))
        raise KernelInputError(f"{name}: {int(bad.sum())} value(s) outside 0..{Q - 1}, first {int(x[first])} "
                               f"at index {first} of shape {x.shape}")


# Barrett reduction (a floor(x·m / 2^32) estimate of floor(x / q)) for the butterflies' products: four cheap
# passes in place of numpy's integer % (a hardware division per value); the NTT of 4,096 polynomials took 48 ms
# with % and 40 ms with this (measured, before chunking).
_BARRETT_SHIFT = 32
_BARRETT_M = (1 << _BARRETT_SHIFT) // Q  # 1,290,167


def _reduce_partly(x: np.ndarray) -> None:
    """x ← x − q·floor(x·m / 2^32) in place, for int64 |x| < 2^32: congruent to x mod q, and in [−q, 2q).

    |x·m / 2^32 − x / q| = |x|·(1/q − m/2^32) < |x| / 2^32 < 1, so the estimate is floor(x / q) or one below it
    (x ≥ 0: remainder in [0, 2q)) or one above it (x < 0: in [−q, q)). |x·m| < 2^53: inside int64. The
    butterflies need their products bounded, not canonical; each transform's last step reduces exactly."""
    quotient = x * _BARRETT_M
    quotient >>= _BARRETT_SHIFT  # an arithmetic shift: floor, for negative values too
    quotient *= Q
    x -= quotient


# Polynomials per pass of the butterflies: 256 × 256 int64 = 512 KiB, within a core's L2, where a batch of
# 4,096 ran 1.6× slower per value (measured on this project's 2-core box).
_CHUNK_POLYS = 256


def _coefficient_major(f: np.ndarray) -> np.ndarray:
    """A C-ordered int64 copy of f [batch, 256] as [256, batch]: each butterfly pass then runs over contiguous
    rows of the whole batch (with the batch last, the late layers' runs of 2 or 4 values cost more in loop
    overhead than in arithmetic). A copy, because the butterflies work in place."""
    return np.array(f.T, dtype=np.int64, order="C")


def _by_chunks(transform: Callable[[np.ndarray], np.ndarray], f: np.ndarray) -> np.ndarray:
    """transform [batch, 256] → [batch, 256] applied to f [..., 256], _CHUNK_POLYS polynomials at a time."""
    flat = f.reshape(-1, N)
    out = np.empty(flat.shape, dtype=np.int64)
    for start in range(0, flat.shape[0], _CHUNK_POLYS):
        out[start : start + _CHUNK_POLYS] = transform(flat[start : start + _CHUNK_POLYS])
    return out.reshape(f.shape)


def _ntt_unchecked(f: np.ndarray) -> np.ndarray:
    return _by_chunks(_ntt_chunk, f)


def _intt_unchecked(f_hat: np.ndarray) -> np.ndarray:
    return _by_chunks(_intt_chunk, f_hat)


def _ntt_chunk(f: np.ndarray) -> np.ndarray:
    """FIPS 203 Algorithm 9 on [batch, 256] values in 0..q−1, every layer's 128 butterflies at once."""
    x = _coefficient_major(f)
    length = N // 2
    while length >= 2:
        blocks = N // (2 * length)
        # Block `start` of this layer takes zetas[i] with i counting up from `blocks` (Algorithm 9, lines 5–6).
        zeta = ZETAS[blocks : 2 * blocks, None, None]
        view = x.reshape(blocks, 2, length, -1)
        lo, hi = view[:, 0], view[:, 1]
        t = zeta * hi  # line 8: t ← ζ·f[j+len]; |hi| < 13q after ≤ 6 layers (below): |ζ·hi| < 13q² < 2^32
        _reduce_partly(t)  # now in [−q, 2q)
        np.subtract(lo, t, out=hi)  # line 9: f[j+len] ← f[j] − t
        lo += t  # line 10: f[j] ← f[j] + t
        # Sums unreduced: each layer widens the range by at most 2q, so after k layers |value| < (2k+1)·q.
        length //= 2
    x %= Q
    return x.T


def _intt_chunk(f_hat: np.ndarray) -> np.ndarray:
    """FIPS 203 Algorithm 10 on [batch, 256] values in 0..q−1, every layer's 128 butterflies at once."""
    x = _coefficient_major(f_hat)
    length = 2
    while length <= N // 2:
        blocks = N // (2 * length)
        # i counts down from 127 (Algorithm 10, lines 2 and 5–6): block b of this layer takes zetas[2·blocks − 1 − b].
        zeta = ZETAS[blocks : 2 * blocks][::-1, None, None]
        view = x.reshape(blocks, 2, length, -1)
        lo, hi = view[:, 0], view[:, 1]
        diff = hi - lo  # line 9 (f[j+len] − t), before f[j] changes
        lo += hi  # line 8: f[j] ← t + f[j+len]; unreduced, so |value| at most doubles per layer: < 2^k·q
        diff *= zeta  # |diff| < 2^7·q at the last layer, so |ζ·diff| < 2^7·q² ≈ 1.4e9 < 2^32
        _reduce_partly(diff)  # in [−q, 2q)
        hi[...] = diff  # line 9: f[j+len] ← ζ·(f[j+len] − t)
        length *= 2
    x *= INV_128  # line 14: f ← f · 3303 mod q (|values| < 2^7·q · 3303 ≈ 1.4e9)
    x %= Q
    return x.T


def _multiply_ntts_unchecked(f_hat: np.ndarray, g_hat: np.ndarray) -> np.ndarray:
    """FIPS 203 Algorithms 11 and 12 on int64 values in 0..q−1, broadcasting over leading axes."""
    f0, f1 = f_hat[..., 0::2].astype(np.int64), f_hat[..., 1::2].astype(np.int64)
    g0, g1 = g_hat[..., 0::2].astype(np.int64), g_hat[..., 1::2].astype(np.int64)
    # Algorithm 12: c0 = a0·b0 + a1·b1·γ, c1 = a0·b1 + a1·b0 (mod q); each term < q², a sum < 2q².
    c0 = (f0 * g0 + (f1 * g1 % Q) * GAMMAS) % Q
    c1 = (f0 * g1 + f1 * g0) % Q
    h = np.empty((*c0.shape[:-1], N), dtype=np.int64)
    h[..., 0::2], h[..., 1::2] = c0, c1
    return h


def ntt(f: np.ndarray) -> np.ndarray:
    """NTT(f) per FIPS 203 Algorithm 9: [..., 256] ints in 0..q−1 → int64 [..., 256] in 0..q−1."""
    _check_polys(f, "ntt input")
    return _ntt_unchecked(f)


def intt(f_hat: np.ndarray) -> np.ndarray:
    """NTT⁻¹(f_hat) per FIPS 203 Algorithm 10: the inverse of `ntt`."""
    _check_polys(f_hat, "intt input")
    return _intt_unchecked(f_hat)


def _broadcast_batch(a: np.ndarray, b: np.ndarray) -> None:
    try:
        np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    except ValueError:
        raise KernelInputError(f"batch shapes {a.shape[:-1]} and {b.shape[:-1]} do not broadcast "
                               f"(operands {a.shape} and {b.shape})") from None


def multiply_ntts(f_hat: np.ndarray, g_hat: np.ndarray) -> np.ndarray:
    """MultiplyNTTs per FIPS 203 Algorithm 11: the product in the NTT domain (leading axes broadcast)."""
    _check_polys(f_hat, "multiply_ntts first operand")
    _check_polys(g_hat, "multiply_ntts second operand")
    _broadcast_batch(f_hat, g_hat)
    return _multiply_ntts_unchecked(f_hat, g_hat)


def multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a·b in Z_q[X] / (X^256 + 1) via the NTT (FIPS 203 §4.3.1): int64 [..., 256] in 0..q−1.

    Leading axes broadcast, so a [k, k, 256] matrix times a [k, 256] vector is one call (then sum over k)."""
    _check_polys(a, "multiply first operand")
    _check_polys(b, "multiply second operand")
    _broadcast_batch(a, b)
    return _intt_unchecked(_multiply_ntts_unchecked(_ntt_unchecked(a), _ntt_unchecked(b)))


def schoolbook_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The reference: the negacyclic convolution c_k = Σ_{i+j=k} a_i·b_j − Σ_{i+j=k+256} a_i·b_j (mod q), O(n²).

    Independent of the NTT: X^256 ≡ −1, so a product term that wraps past degree 255 comes back negated."""
    _check_polys(a, "schoolbook first operand")
    _check_polys(b, "schoolbook second operand")
    _broadcast_batch(a, b)
    k, j = np.arange(N)[:, None], np.arange(N)[None, :]
    sign = np.where(k >= j, 1, -1).astype(np.int64)  # b_{k−j} if k ≥ j, else −b_{k−j+256}
    wrapped = b.astype(np.int64)[..., (k - j) % N] * sign  # [..., 256, 256]: c = wrapped @ a
    # Each row sums 256 products below q² ≈ 1.1e7 in magnitude: < 2.9e9, inside int64.
    product: np.ndarray = np.matmul(wrapped, a.astype(np.int64)[..., :, None])[..., 0] % Q
    return product


@dataclass(frozen=True)
class OpCounts:
    """Modular operations of one polynomial multiplication by FIPS 203's algorithms (one op = one mul or add)."""

    transform_multiplies: int
    transform_adds: int  # additions and subtractions
    other_multiplies: int  # BaseCaseMultiply's and the final scale by 3303
    other_adds: int

    @property
    def transform_ops(self) -> int:
        return self.transform_multiplies + self.transform_adds

    @property
    def other_ops(self) -> int:
        return self.other_multiplies + self.other_adds

    @property
    def total(self) -> int:
        return self.transform_ops + self.other_ops

    @property
    def input_bytes(self) -> int:
        """Two polynomials as FIPS 203 encodes them (ByteEncode_12): 2 × 384 B."""
        return 2 * ENCODED_POLY_BYTES

    def ops_per_input_byte(self, transform_charged: bool = True) -> float:
        return (self.total if transform_charged else self.other_ops) / self.input_bytes


_BUTTERFLIES = LAYERS * N // 2  # 7 layers × 128 butterflies per transform (Algorithms 9, 10)
# multiply = NTT(a) + NTT(b) + NTT⁻¹: three transforms of 896 butterflies, each 1 modular multiply and
# 2 modular adds (t = ζ·x; x ± t). Algorithm 11 runs Algorithm 12 128 times: 5 multiplies (a0b0, a1b1, ·γ,
# a0b1, a1b0) and 2 adds each. Algorithm 10 ends with 256 multiplies by 3303.
# Total 9,216 ops on 768 B of input = 12.0 op/B (10.5 of it the three transforms, 1.5 the rest).
MULTIPLY_OP_COUNTS = OpCounts(
    transform_multiplies=3 * _BUTTERFLIES,
    transform_adds=3 * 2 * _BUTTERFLIES,
    other_multiplies=5 * (N // 2) + N,
    other_adds=2 * (N // 2),
)


def declaration(transform_charged: bool = True) -> KernelDeclaration:
    """The multiplication as a module kernel (docs/reference.md §5): NTT and modular arithmetic, both in the published
    set.

    The NTT's cost goes in `ops_per_byte` (the declaration's `transform_length` prices a BF16 FFT, not an NTT
    over Z_q); `transform_charged=False` leaves out the three transforms' ops, as if the optics did them free.
    Ratio 2: two encoded polynomials in, one out."""
    return KernelDeclaration(
        "ml-kem-poly-multiply",
        ratio=2.0,
        ops_per_byte=MULTIPLY_OP_COUNTS.ops_per_input_byte(transform_charged),
        op_types=frozenset({"ntt", "modular"}),
        transform_charged=transform_charged,
    )
