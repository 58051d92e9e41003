"""The codec header: a few dozen bytes that, with the payload bytes alone, are enough to invert a codec.

Little-endian, `struct`-packed, in three parts:

    prefix   "<4sBBBB"   magic b"KVTC", version (1), codec id, wire dtype id, ndim (2..8)
    shape    "<{ndim}I"  the original array's shape (uint32 each)
    params   per codec:
        none         (nothing)
        fp8          "<I"        values per scale block
        fp4-block    "<I"        values per scale block (32)
        freq-keep-k  "<IIIIBB"   block n, sinks, kept reals per full block, kept reals in the ragged tail
                                 (0 = no tail), variant (0 dct, 1 fft), precision_bits (0 = none; informative)
        kivi-2       "<BI"       bits per code (2), values per group (32 live; kernels/kivi.py)
        kivi-3       "<BI"       bits per code (3), values per group

Largest header: 8 + 8·4 + 18 = 58 bytes (< MAX_HEADER_BYTES).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from kvtransit.kernels.errors import KernelInputError

MAGIC = b"KVTC"
VERSION = 1
MAX_NDIM = 8
MAX_HEADER_BYTES = 256  # the middlebox's promise to the wire layer: headers stay small

_PREFIX = struct.Struct("<4sBBBB")
_PARAMS = {
    "none": struct.Struct("<"),
    "fp8": struct.Struct("<I"),
    "fp4-block": struct.Struct("<I"),
    "freq-keep-k": struct.Struct("<IIIIBB"),
    "kivi-2": struct.Struct("<BI"),
    "kivi-3": struct.Struct("<BI"),
}
CODEC_IDS = {"none": 0, "fp8": 1, "fp4-block": 2, "freq-keep-k": 3, "kivi-2": 4, "kivi-3": 5}
_CODEC_BY_ID = {v: k for k, v in CODEC_IDS.items()}

WIRE_DTYPES: dict[str, np.dtype] = {
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
}
_DTYPE_IDS = {"bfloat16": 1, "float16": 2, "float32": 3}
_DTYPE_BY_ID = {v: k for k, v in _DTYPE_IDS.items()}


def wire_dtype_name(dtype: np.dtype) -> str:
    """'bfloat16' | 'float16' | 'float32', or KernelInputError naming the unsupported dtype."""
    for name, known in WIRE_DTYPES.items():
        if dtype == known:
            return name
    raise KernelInputError(f"unsupported KV dtype {dtype} (choose from: {', '.join(WIRE_DTYPES)})")


@dataclass(frozen=True)
class Header:
    codec: str
    dtype: str  # a WIRE_DTYPES key
    shape: tuple[int, ...]
    params: tuple[int, ...]  # the codec's fields, in the order documented above

    def pack(self) -> bytes:
        ndim = len(self.shape)
        if not 2 <= ndim <= MAX_NDIM:
            raise KernelInputError(f"header: ndim must be in 2..{MAX_NDIM}, got {ndim}")
        if any(not 0 <= d < 2**32 for d in self.shape):
            raise KernelInputError(f"header: dimension out of uint32 range in shape {self.shape}")
        return (
            _PREFIX.pack(MAGIC, VERSION, CODEC_IDS[self.codec], _DTYPE_IDS[self.dtype], ndim)
            + struct.pack(f"<{ndim}I", *self.shape)
            + _PARAMS[self.codec].pack(*self.params)
        )

    @property
    def np_dtype(self) -> np.dtype:
        return WIRE_DTYPES[self.dtype]

    @classmethod
    def unpack(cls, data: bytes) -> Header:
        data = bytes(data)
        if len(data) < _PREFIX.size:
            raise KernelInputError(f"codec header too short: {len(data)} bytes < {_PREFIX.size}")
        magic, version, codec_id, dtype_id, ndim = _PREFIX.unpack_from(data)
        if magic != MAGIC:
            raise KernelInputError(f"codec header: bad magic {magic!r} (expected {MAGIC!r})")
        if version != VERSION:
            raise KernelInputError(f"codec header: unsupported version {version} (expected {VERSION})")
        if codec_id not in _CODEC_BY_ID:
            raise KernelInputError(f"codec header: unknown codec id {codec_id}")
        if dtype_id not in _DTYPE_BY_ID:
            raise KernelInputError(f"codec header: unknown dtype id {dtype_id}")
        if not 2 <= ndim <= MAX_NDIM:
            raise KernelInputError(f"codec header: ndim {ndim} outside 2..{MAX_NDIM}")
        codec = _CODEC_BY_ID[codec_id]
        params_struct = _PARAMS[codec]
        expected = _PREFIX.size + 4 * ndim + params_struct.size
        if len(data) != expected:
            raise KernelInputError(f"codec header for {codec}: {len(data)} bytes, expected {expected}")
        shape = struct.unpack_from(f"<{ndim}I", data, _PREFIX.size)
        params = params_struct.unpack_from(data, _PREFIX.size + 4 * ndim)
        return cls(codec, _DTYPE_BY_ID[dtype_id], tuple(shape), tuple(params))
