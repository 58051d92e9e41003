"""The module's NTT kernel (kernels/ntt.py) checked against kyber-py's own arithmetic on a real ML-KEM key pair.

An ML-KEM-768 key pair carries polynomials in both domains: the encapsulation key's t̂ (k polynomials, NTT domain)
and seed ρ, the decapsulation key's ŝ (FIPS 203 Algorithm 13: t̂ = Â∘ŝ + ê). On those actual polynomials:

- decode: `byte_decode_12` gives the library's `decode(…, 12)` coefficients;
- inverse: `intt(t̂)` equals the library's `from_ntt()`; forward: `ntt(t)` equals its `to_ntt()` (and gives t̂ back);
- products: `multiply_ntts(Â[i][j], ŝ[j])` equals the library's NTT-domain product, Â rebuilt by the library
  from ρ (`_generate_matrix_from_seed`, a private method of kyber-py 1.2.0: its own SampleNTT);
- consistency: e = NTT⁻¹(t̂ − Σ_j Â[i][j]∘ŝ[j]) by our kernels has every centred coefficient within ±η₁ (FIPS 203:
  ê was sampled from CBD_η₁), which no wrong transform would give.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtransit.kernels.mlkem_encoding import byte_decode_12
from kvtransit.kernels.ntt import ENCODED_POLY_BYTES, Q, intt, multiply_ntts, ntt

SEED_BYTES = 32  # FIPS 203 §7.1: ρ, the last 32 bytes of the encapsulation key


@dataclass(frozen=True)
class NttCheck:
    """Coefficient mismatches per check (all 0: the kernel agrees with the library exactly)."""

    polynomials: int  # polynomials compared per check
    mismatches: dict[str, int] = field(default_factory=dict)
    error_max_abs: int = 0  # largest |e| coefficient recovered by our kernels
    error_bound: int = 0  # η₁

    @property
    def ok(self) -> bool:
        return not any(self.mismatches.values()) and self.error_max_abs <= self.error_bound

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "polynomials": self.polynomials, "mismatches": dict(self.mismatches),
                "error_max_abs": self.error_max_abs, "error_bound": self.error_bound}


def _coeffs(polys: list[Any]) -> np.ndarray:
    return np.array([p.coeffs for p in polys], dtype=np.int64)


def check_against_library(kem: Any, ek: bytes, dk: bytes) -> NttCheck:
    """Compare our kernels with `kem`'s (a kyber_py ML_KEM) on key pair (ek, dk)."""
    k, ring = kem.k, kem.R
    span = k * ENCODED_POLY_BYTES
    t_hat_bytes, rho, s_hat_bytes = ek[:span], ek[span:span + SEED_BYTES], dk[:span]

    def decode(data: bytes) -> list[Any]:
        return [ring.decode(data[i * ENCODED_POLY_BYTES:(i + 1) * ENCODED_POLY_BYTES], 12, is_ntt=True)
                for i in range(k)]

    lib_t_hat, lib_s_hat = decode(t_hat_bytes), decode(s_hat_bytes)
    t_hat, s_hat = byte_decode_12(t_hat_bytes), byte_decode_12(s_hat_bytes)
    # The library's transforms work in place on a polynomial's coefficient list: hand them copies.
    lib_t = [ring(list(p.coeffs), is_ntt=True).from_ntt() for p in lib_t_hat]
    lib_t_hat_again = [ring(list(p.coeffs)).to_ntt() for p in lib_t]
    a_hat = kem._generate_matrix_from_seed(rho)
    lib_products = [[a_hat[i, j] * lib_s_hat[j] for j in range(k)] for i in range(k)]
    a_hat_ours = np.array([[a_hat[i, j].coeffs for j in range(k)] for i in range(k)], dtype=np.int64)

    ours_t = intt(t_hat)
    ours_products = multiply_ntts(a_hat_ours, s_hat[None, :, :])  # [i, j, 256]
    mismatches = {
        "decode": int((t_hat != _coeffs(lib_t_hat)).sum() + (s_hat != _coeffs(lib_s_hat)).sum()),
        "intt": int((ours_t != _coeffs(lib_t)).sum()),
        "ntt": int((ntt(ours_t) != _coeffs(lib_t_hat_again)).sum() + (ntt(ours_t) != t_hat).sum()),
        "multiply_ntts": int(sum((ours_products[i, j] != np.array(lib_products[i][j].coeffs)).sum()
                                 for i in range(k) for j in range(k))),
    }
    e = intt((t_hat - ours_products.sum(axis=1)) % Q)
    centred = np.where(e > Q // 2, e - Q, e)
    return NttCheck(polynomials=k, mismatches=mismatches, error_max_abs=int(np.abs(centred).max()),
                    error_bound=int(kem.eta_1))
