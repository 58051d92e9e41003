"""CKKS's own kernel declaration (docs/reference.md §7.10): one key switch on a ciphertext as it crosses the link, at
the encrypted layer's parameters (ring degree N = 8,192, coefficient moduli 60/40/40/60 bits, the last the special
prime).

A key switch is what every homomorphic rotation and every relinearisation runs (the unit of CKKS evaluation, and the
bulk of it: the layer's vector-matrix product is a rotation per diagonal), and it is NTTs and modular arithmetic only
(the module's published demonstration, docs/reference.md §5.1). It takes a ciphertext (c0, c1) at level ℓ (ℓ data
primes q_i in RNS, N coefficients each) to one of the same shape: the module reads and writes the same bytes,
ratio 1. Counted as the hybrid key switch with one special prime P and one RNS limb a digit (SEAL's, which TenSEAL
runs), step by step (docs/reference.md §7.10 derives each term):

1. c1 out of the NTT domain: ℓ inverse NTTs, each ending with N multiplies by N⁻¹.
2. Each digit j (limb j of c1) brought to the other ℓ primes and P: ℓ·(ℓ+1)·N modular reductions and ℓ² forward
   NTTs (the digit needs none in its own prime).
3. The inner product with the key's two polynomials: 2·ℓ·(ℓ+1)·N modular multiplies and as many adds.
4. Mod down by P, for each of the two results: its P-limb out of the NTT domain (1 inverse NTT, N multiplies by
   N⁻¹), reduced into each q_i (ℓ·N), into the NTT domain (ℓ NTTs), subtracted and multiplied by P⁻¹ (2·ℓ·N).
5. c0 added in: ℓ·N adds.

A butterfly is 1 modular multiply and 2 modular adds, (N/2)·log2 N of them a transform: kernels/ntt.py's count for
ML-KEM, so the two declarations count alike. A byte is a byte of the ciphertext's coefficients packed at their
moduli's widths (2·N·Σ log2 q_i bits: what the module must read), not SEAL's 64-bit words.

Not in the count: the automorphism of a rotation (a fixed permutation of coefficients, wiring) and the key itself,
which the module must hold (2·ℓ·(ℓ+1)·N words, `key_bytes`: 1.6 MB a key at the top level, one key per rotation
step; the deck's module sketch has no memory for it).
Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import KernelDeclaration

# The encrypted layer's parameters (flows/ciphertext/encrypted_layer.py: POLY_MODULUS_DEGREE, COEFF_MOD_BIT_SIZES;
# TenSEAL's tutorial set, docs/reference.md §7.8). Kept here as numbers (model/ may not import a flow); a unit test
# holds the two equal.
RING_DEGREE = 8192
COEFF_MOD_BITS = (60, 40, 40, 60)
# kernels/ntt.py: a butterfly is one modular multiply and two modular adds (t = ζ·x; x ± t).
BUTTERFLY_OPS = 3
SEAL_WORD_BYTES = 8  # SEAL holds each RNS coefficient in a 64-bit word (the key's size in memory)


def _check(n: int, data_bits: Sequence[int], special_bits: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2 or n & (n - 1):
        raise ConfigError(f"CKKS ring degree must be a power of two >= 2, got {n!r}")
    if not data_bits:
        raise ConfigError("a CKKS ciphertext needs at least one data prime")
    for bits in (*data_bits, special_bits):
        if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 62:
            raise ConfigError(f"a CKKS modulus must be 2..62 bits (SEAL's limit), got {bits!r}")


@dataclass(frozen=True)
class KeySwitchCount:
    """Modular operations of one hybrid key switch (module docstring), split by transform and the rest."""

    ring_degree: int
    level: int  # ℓ: the data primes the ciphertext carries
    forward_ntts: int
    inverse_ntts: int
    other_ops: int  # reductions, the inner product, mod down's arithmetic, the N⁻¹ scalings, c0's adds
    ciphertext_bytes: int  # 2·N·Σ log2 q_i / 8 of the ciphertext's ℓ data primes

    @property
    def ntt_ops(self) -> int:
        butterflies = self.ring_degree // 2 * int(math.log2(self.ring_degree))
        return (self.forward_ntts + self.inverse_ntts) * butterflies * BUTTERFLY_OPS

    @property
    def total(self) -> int:
        return self.ntt_ops + self.other_ops

    def ops_per_byte(self, transform_charged: bool = True) -> float:
        return (self.total if transform_charged else self.other_ops) / self.ciphertext_bytes


def key_switch_count(n: int = RING_DEGREE, data_bits: Sequence[int] = COEFF_MOD_BITS[:-1],
                     special_bits: int = COEFF_MOD_BITS[-1]) -> KeySwitchCount:
    """One key switch of a ciphertext whose data primes have `data_bits` bits (the level ℓ is their number)."""
    _check(n, data_bits, special_bits)
    level = len(data_bits)
    forward = level * level + 2 * level  # step 2's ℓ², step 4's ℓ for each of the two results
    inverse = level + 2  # step 1's ℓ, step 4's one for each of the two results
    other = (inverse * n  # every inverse NTT's final scale by N⁻¹
             + level * (level + 1) * n  # step 2: each digit reduced into the ℓ + 1 primes
             + 2 * 2 * level * (level + 1) * n  # step 3: a multiply and an add per key coefficient, two polynomials
             + 2 * level * n  # step 4: the P-limb reduced into each q_i, for both results
             + 2 * 2 * level * n  # step 4: subtract, multiply by P⁻¹
             + level * n)  # step 5: c0 added in
    nbytes = 2 * n * sum(data_bits) // 8
    return KeySwitchCount(n, level, forward, inverse, other, nbytes)


def key_bytes(n: int = RING_DEGREE, data_bits: Sequence[int] = COEFF_MOD_BITS[:-1]) -> int:
    """A key-switching key in SEAL's words: ℓ digits × 2 polynomials × (ℓ + 1) limbs × N words."""
    level = len(data_bits)
    return level * 2 * (level + 1) * n * SEAL_WORD_BYTES


def required_bits(modulus_bits: Sequence[int]) -> int:
    """The one rule for modular kernels (docs/reference.md §7.10): exact arithmetic must hold a product of two
    residues before its reduction, twice the widest modulus's bits."""
    return 2 * max(modulus_bits)


def declaration(transform_charged: bool = True, n: int = RING_DEGREE,
                data_bits: Sequence[int] = COEFF_MOD_BITS[:-1], special_bits: int = COEFF_MOD_BITS[-1]
                ) -> KernelDeclaration:
    """One key switch on each ciphertext crossing, as a module kernel: NTT and modular arithmetic, ratio 1 (a
    ciphertext in, one of the same shape out). `transform_charged=False` leaves the NTTs out, as if the optics did them
    free (the ops then are the rest)."""
    count = key_switch_count(n, data_bits, special_bits)
    return KernelDeclaration("ckks-key-switch", ratio=1.0, ops_per_byte=count.ops_per_byte(transform_charged),
                             op_types=frozenset({"ntt", "modular"}), transform_charged=transform_charged)
