"""Requantisers: fp8 (E4M3, per-block scale) and fp4-block (E2M1, 32-value blocks, 8-bit power-of-two
scale, as OCP MXFP4), and the int8 / int4 baselines the accuracy tables compare against.

Blocks run over the array flattened in C order (the last axis, head_dim, is contiguous, so a 32- or
64-value block is part of one token's head vector); a ragged last block is padded with zeros for the
arithmetic only, never on the wire. All of these need rounding, which the module does not publish
(docs/reference.md §5): they run on the host, or are rejected, by policy.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
E4M3_MAX = 448.0  # largest finite E4M3 value (OCP 8-bit floating point spec)
E2M1_MAX = 6.0  # largest E2M1 value (OCP microscaling formats spec)
FP4_BLOCK = 32  # MXFP4's block: 32 values share one E8M0 scale → 64/17 vs BF16 (docs/reference.md §5)
DEFAULT_FP8_BLOCK = 64
INT_BASELINE_GROUP = 32  # values per float16 scale in the int8/int4 baselines


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    """x flattened to float32, zero-padded to whole blocks, as [nblocks, block]."""
    flat = x.astype(np.float32, copy=False).reshape(-1)
    pad = -flat.size % block
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, np.float32)])
    return flat.reshape(-1, block)


def fp8_encode(x: np.ndarray, block: int) -> np.ndarray:
    """uint8 payload: `x.size` E4M3 codes, then one float32 scale per block (amax / 448)."""
    b = _blocks(x, block)
    scale = np.abs(b).max(axis=1, keepdims=True) / np.float32(E4M3_MAX)
    scale[scale == 0] = 1.0  # an all-zero block: any scale decodes to zeros
    codes = np.clip(b / scale, -E4M3_MAX, E4M3_MAX).astype(E4M3)  # E4M3 has no inf: clip, or NaN
    return np.concatenate([codes.reshape(-1)[: x.size].view(np.uint8),
                           scale.astype(np.float32).reshape(-1).view(np.uint8)])


def fp8_decode(payload: np.ndarray, size: int, block: int) -> np.ndarray:
    """float32 values [size] from an fp8 payload."""
    nblocks = math.ceil(size / block)
    codes = payload[:size].view(E4M3).astype(np.float32)
    scale = payload[size : size + 4 * nblocks].view(np.float32)
    padded = np.zeros(nblocks * block, np.float32)
    padded[:size] = codes
    return (padded.reshape(nblocks, block) * scale[:, None]).reshape(-1)[:size]


def fp8_payload_bytes(size: int, block: int) -> int:
    return size + 4 * math.ceil(size / block)


def fp4_encode(x: np.ndarray) -> np.ndarray:
    """uint8 payload: E2M1 codes two per byte (low nibble first), then one E8M0 scale byte per 32 values.

    scale = 2^⌈log2(amax / 6)⌉, so every scaled value is within E2M1's ±6."""
    b = _blocks(x, FP4_BLOCK)
    amax = np.abs(b).max(axis=1, keepdims=True)
    exponent = np.ceil(np.log2(np.where(amax > 0, amax, E2M1_MAX) / np.float32(E2M1_MAX)))
    scale = np.exp2(np.clip(exponent, -127, 127)).astype(np.float32)
    nibbles = (b / scale).astype(E2M1).view(np.uint8).reshape(-1)[: x.size] & 0x0F
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return np.concatenate([packed, scale.reshape(-1).astype(E8M0).view(np.uint8)])


def fp4_decode(payload: np.ndarray, size: int) -> np.ndarray:
    nblocks = math.ceil(size / FP4_BLOCK)
    code_bytes = (size + 1) // 2
    packed = payload[:code_bytes]
    nibbles = np.empty(2 * code_bytes, np.uint8)
    nibbles[0::2] = packed & 0x0F
    nibbles[1::2] = packed >> 4
    values = np.zeros(nblocks * FP4_BLOCK, np.float32)
    values[:size] = nibbles[:size].view(E2M1).astype(np.float32)
    scale = payload[code_bytes : code_bytes + nblocks].view(E8M0).astype(np.float32)
    decoded: np.ndarray = (values.reshape(nblocks, FP4_BLOCK) * scale[:, None]).reshape(-1)[:size]
    return decoded


def fp4_payload_bytes(size: int) -> int:
    return (size + 1) // 2 + math.ceil(size / FP4_BLOCK)


def int_quantise_roundtrip(x: np.ndarray, bits: int, group: int = INT_BASELINE_GROUP) -> tuple[np.ndarray, int]:
    """Symmetric absmax integer quantisation (a baseline): (dequantised float32 in x's shape, payload bytes).

    Each group of `group` values shares a float16 scale amax / (2^(bits−1) − 1); codes are rounded to the
    nearest integer in ±(2^(bits−1) − 1). Payload: bits/8 per value plus 2 bytes per group."""
    qmax = 2 ** (bits - 1) - 1
    b = _blocks(x, group)
    scale = (np.abs(b).max(axis=1, keepdims=True) / np.float32(qmax)).astype(np.float16).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(b / scale), -qmax, qmax)
    out = (q * scale).reshape(-1)[: x.size].reshape(x.shape)
    return out, math.ceil(x.size * bits / 8) + 2 * b.shape[0]
