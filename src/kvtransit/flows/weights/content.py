"""What a weight flow carries, and the lossless kernels it may run (pure numpy; no I/O).

The bytes are BF16 values drawn from a seeded Gaussian of a weight's spread: the model's weights (one stream), and
each adapter's LoRA matrices (one stream an adapter, seeded by its id), at the run's scale. Synthetic on purpose:
zstd compresses such values within 0.01 of SmolLM2's real BF16 weights of the same spread
(docs/results/weights.md), and they cost no model download. Every byte is made again at the instance to check
what arrived is what was sent, bit for bit (a lossless flow: anything else is a failure, never an error figure).

Kernels (`LosslessKernel`): `none` (the bytes as they are) and `zstd` (a real lossless compressor, the baseline a
user would try; its data-dependent branches are comparisons, which the module does not publish, so it runs at the
two hosts: compressed at the store, decompressed at the instance). A lossy kernel is refused before anything runs
(model/module/budget.py: flow_check).
"""

from __future__ import annotations

import numpy as np
import zstandard

from kvtransit.kernels.header import WIRE_DTYPES

BF16 = WIRE_DTYPES["bfloat16"]
# The spread of a projection's weights (docs/results/weights.md: SmolLM2's projections, std 0.02 to the 2 digits
# shown there) and of a LoRA matrix at initialisation-scale updates.
WEIGHT_STD = 0.02
WEIGHTS_SEED = 1 << 20  # the weights' stream, apart from every adapter's (seeded by its id, 0..2^20 − 1)
ZSTD_LEVEL = 3  # zstd's default level
KERNELS = ("none", "zstd")


class BlobError(ValueError):
    """Bytes that are not what was sent; the message says what differed."""


def values(nbytes: int, seed: int) -> bytes:
    """`nbytes` (even) of BF16 values ~ N(0, WEIGHT_STD²) from `seed`."""
    count = nbytes // 2
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count, dtype=np.float32) * WEIGHT_STD).astype(BF16).tobytes()


def weights(nbytes: int) -> bytes:
    return values(nbytes, WEIGHTS_SEED)


def adapter(adapter_id: int, nbytes: int) -> bytes:
    if not 0 <= adapter_id < WEIGHTS_SEED:
        raise BlobError(f"adapter id {adapter_id} outside 0..{WEIGHTS_SEED - 1}")
    return values(nbytes, adapter_id)


class LosslessKernel:
    def __init__(self, name: str):
        if name not in KERNELS:
            raise BlobError(f"unknown lossless kernel {name!r} (choose from: {', '.join(KERNELS)})")
        self.name = name

    def encode(self, raw: bytes) -> bytes:
        return raw if self.name == "none" else zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw)

    def decode(self, wire: bytes, expected: bytes, what: str) -> None:
        """Check `wire` gives back `expected` exactly; BlobError naming `what` and the first difference if not."""
        try:
            raw = wire if self.name == "none" else zstandard.ZstdDecompressor().decompress(wire)
        except zstandard.ZstdError as exc:
            raise BlobError(f"{what}: zstd could not decompress it: {exc}") from None
        if raw != expected:
            if len(raw) != len(expected):
                raise BlobError(f"{what}: {len(raw)} B arrived, {len(expected)} B were sent")
            first = next(i for i, (a, b) in enumerate(zip(raw, expected, strict=True)) if a != b)
            raise BlobError(f"{what}: byte {first} differs from what was sent (a lossless flow)")
