"""FIPS 203's ByteEncode_12 / ByteDecode_12 (Algorithms 5 and 6, d = 12) over numpy: 256 coefficients ↔ 384 bytes.

What the module would read off a ciphertext flow before its NTT kernel (`kernels/ntt.py`) runs: an ML-KEM
encapsulation key is k such polynomials (t̂, already in the NTT domain) followed by the 32-byte seed ρ.
Two 12-bit coefficients pack little-endian into three bytes: b0 = a0 & 0xFF, b1 = (a0 >> 8) | (a1 & 0xF) << 4,
b2 = a1 >> 4 (the bit order of Algorithm 5).
"""

from __future__ import annotations

import numpy as np

from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.ntt import ENCODED_POLY_BYTES, N, Q


def byte_decode_12(data: bytes) -> np.ndarray:
    """Algorithm 6 with d = 12 on every 384-byte polynomial of `data`: int64 [len/384, 256].

    FIPS 203 reduces each 12-bit value mod q (a value ≥ q is what §7.2's modulus check refuses in a key)."""
    if len(data) == 0 or len(data) % ENCODED_POLY_BYTES:
        raise KernelInputError(f"ByteDecode_12 needs a whole number of {ENCODED_POLY_BYTES}-byte polynomials, "
                               f"got {len(data)} bytes")
    triples = np.frombuffer(data, dtype=np.uint8).astype(np.int64).reshape(-1, N // 2, 3)
    b0, b1, b2 = triples[..., 0], triples[..., 1], triples[..., 2]
    out = np.empty((triples.shape[0], N), dtype=np.int64)
    out[:, 0::2] = b0 | (b1 & 0x0F) << 8
    out[:, 1::2] = b1 >> 4 | b2 << 4
    reduced: np.ndarray = out % Q
    return reduced


def byte_encode_12(polys: np.ndarray) -> bytes:
    """Algorithm 5 with d = 12: int [..., 256] in 0..q−1 → 384 bytes per polynomial, in order."""
    if not isinstance(polys, np.ndarray) or not np.issubdtype(polys.dtype, np.integer) or polys.shape[-1:] != (N,):
        raise KernelInputError(f"ByteEncode_12 needs an integer array [..., {N}], got "
                               f"{getattr(polys, 'shape', type(polys).__name__)}")
    if polys.size and (int(polys.min()) < 0 or int(polys.max()) >= Q):
        raise KernelInputError(f"ByteEncode_12 needs coefficients in 0..{Q - 1}, got {int(polys.min())}.."
                               f"{int(polys.max())}")
    flat = polys.reshape(-1, N).astype(np.int64)
    a0, a1 = flat[:, 0::2], flat[:, 1::2]
    triples = np.stack([a0 & 0xFF, a0 >> 8 | (a1 & 0x0F) << 4, a1 >> 4], axis=-1).astype(np.uint8)
    return triples.tobytes()
