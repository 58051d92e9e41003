"""A ring rank's KV blocks and the codec on its links: real KV from the committed sample, real bytes on the wire.

The blocks are the real-KV sample's (kernels/accuracy.py: SmolLM2-135M, [layers, kv_heads, T, D] per text) split
into n equal blocks along tokens, block j held by rank j (kernels/ring_attention.py: block_bounds). The model's
layer ℓ carries the sample's layer ℓ mod L_s: every hop is a real layer's KV, and the sample's L_s layers are
the ones whose attention output is measured. A block in flight is one frame [1, 2, kv_heads, t, D] (K and V of
one layer, the offline frame's layout for a single layer), cast to the wire dtype.

`LinkCodec` is the kernel on a ring link, run for real: `encode` at the sending end (the block as the sender holds
it, cast to the wire dtype, through the registry's codec), `decode` at the receiving end. A block forwarded on is
the decoded one, so a lossy codec's error accumulates hop after hop as it would (docs/reference.md §7). Band-keep's
analogue noise (`precision_bits`) is drawn afresh every hop, seeded by the hop number as the offline measure
(kernels/ring_attention.py: wire_codec) seeds it.

Wire format of a block: u32 header length (big-endian) | the codec's header | its payload.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kvtransit.kernels.accuracy import KVSample, load_sample
from kvtransit.kernels.header import WIRE_DTYPES
from kvtransit.kernels.registry import get_codec
from kvtransit.kernels.ring_attention import block_bounds

HEADER_LENGTH = struct.Struct("!I")


class BlockError(ValueError):
    """A block that is not what this ring carries (its shape, its header); the message says what was wrong."""


@dataclass(frozen=True)
class RingKV:
    """One text of the sample, split for a ring of `n`: what every rank of the group agrees on."""

    sample: KVSample
    n: int

    @classmethod
    def load(cls, path: str, text: str, n: int) -> RingKV:
        samples = load_sample(path)
        if text not in samples:
            raise BlockError(f"{path}: no text {text!r} (choose from: {', '.join(samples)})")
        kv = cls(samples[text], n)
        kv.bounds  # noqa: B018 (checks the split now: a ring that cannot split the sample fails before it starts)
        return kv

    @property
    def bounds(self) -> list[tuple[int, int]]:
        return block_bounds(self.sample.k.shape[2], self.n)

    @property
    def sample_layers(self) -> int:
        return int(self.sample.k.shape[0])

    @property
    def block_tokens(self) -> int:
        return self.sample.k.shape[2] // self.n

    def block(self, rank: int, layer: int) -> np.ndarray:
        """Rank `rank`'s own block of model layer `layer`: [1, 2, kv_heads, t, D] float32."""
        start, end = self.bounds[rank]
        s = layer % self.sample_layers
        return np.stack([self.sample.k[s, :, start:end], self.sample.v[s, :, start:end]])[None].astype(np.float32)

    def raw_bytes(self, bytes_per_value: int = 2) -> int:
        """One block of one layer, uncoded, at `bytes_per_value` (the wire dtype's)."""
        _, kv_heads, _, d = self.sample.k.shape
        return 2 * kv_heads * self.block_tokens * d * bytes_per_value

    def query_rank(self) -> int | None:
        """The rank holding every one of the sample's decode queries (their positions' block), or None."""
        if self.sample.q_positions is None:
            return None
        owners = {int(p) // self.block_tokens for p in self.sample.q_positions}
        return owners.pop() if len(owners) == 1 else None


class RingBlocks(Protocol):
    """What a ring rank needs of its KV (rank.py): every rank's block of a layer, and their size."""

    @property
    def sample_layers(self) -> int: ...

    def block(self, rank: int, layer: int) -> np.ndarray: ...

    def raw_bytes(self, bytes_per_value: int = 2) -> int: ...


@dataclass(frozen=True)
class SyntheticRingKV:
    """A ring's blocks inside `kvtransit up` (flows/ring/ring_class.py): synthetic KV at the run's scale, each block
    `block_tokens` tokens of the scaled layout's channels (kv_heads × head_dim: the hand-off's scale), so a hop
    carries the model's block bytes × the run's effective scale. The content is seeded noise: with no codec on the
    ring's links nothing reads it but the wire's checks (the ring's error under a codec is `kvtransit ring`'s, on
    real KV). `layers` distinct layers are made; model layer ℓ carries layer ℓ mod `layers`."""

    n: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    seed: int = 0
    layers: int = 1

    @property
    def sample_layers(self) -> int:
        return self.layers

    def block(self, rank: int, layer: int) -> np.ndarray:
        """Rank `rank`'s own block of model layer `layer`: [1, 2, kv_heads, t, D] float32."""
        rng = np.random.default_rng([self.seed, rank, layer % self.layers])
        return rng.standard_normal((1, 2, self.kv_heads, self.block_tokens, self.head_dim), np.float32)

    def raw_bytes(self, bytes_per_value: int = 2) -> int:
        return 2 * self.kv_heads * self.block_tokens * self.head_dim * bytes_per_value


class LinkCodec:
    """The kernel on a ring link: `name` with the registry's keyword arguments (`params`), on `wire_dtype`."""

    def __init__(self, name: str, params: dict[str, Any] | None = None, wire_dtype: str = "bfloat16"):
        if wire_dtype not in WIRE_DTYPES:
            raise BlockError(f"unknown wire dtype {wire_dtype!r} (choose from: {', '.join(WIRE_DTYPES)})")
        self.name, self.params, self.wire = name, dict(params or {}), WIRE_DTYPES[wire_dtype]
        get_codec(name, **self.params)  # an unknown codec or setting fails here, before the ring is made

    def _codec(self, hop: int):
        params = dict(self.params)
        if self.name == "freq-keep-k":
            params["seed"] = hop  # fresh analogue noise a hop (module docstring)
        return get_codec(self.name, **params)

    def encode(self, block: np.ndarray, hop: int) -> bytes:
        """`block` (float32) as it crosses hop number `hop` (1 = its first)."""
        encoded = self._codec(hop).encode(np.ascontiguousarray(block.astype(self.wire)))
        return HEADER_LENGTH.pack(len(encoded.header)) + encoded.header + encoded.payload.tobytes()

    def decode(self, wire: bytes | bytearray | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        """The block a receiver gets back (float32), checked to have `shape`."""
        view = memoryview(wire)
        if view.nbytes < HEADER_LENGTH.size:
            raise BlockError(f"a block of {view.nbytes} B has no header length")
        (length,) = HEADER_LENGTH.unpack_from(view)
        header = bytes(view[HEADER_LENGTH.size:HEADER_LENGTH.size + length])
        payload = np.frombuffer(view, np.uint8, offset=HEADER_LENGTH.size + length)
        out = self._codec(0).decode(header, payload)
        if out.shape != shape:
            raise BlockError(f"a block decoded to shape {out.shape}, expected {shape}")
        return np.asarray(out, dtype=np.float32)
