"""KIVI-style 2- and 3-bit KV requantisers (docs/reference.md §5: KIVI, arXiv:2402.02750; KVQuant's 3 bits,
arXiv:2401.18079).

Asymmetric uniform quantisation with `bits` bits per value, per group of `group` values: a group stores its
zero point (its minimum) and its step ((max − min) / (2^bits − 1)) as float16 each, and a value becomes
round((x − zero) / step), an integer in 0..2^bits − 1. KIVI's observation is that keys have outlier
*channels* and values do not, so (KIVI §3–4):
- keys are grouped per channel along tokens: a group is `group` consecutive tokens of one channel of one row;
- values are grouped per token along channels: a group is `group` consecutive channels of one token's head
  vector (head_dim < group: the whole head vector is one group; a ragged last group is the remainder).
The group size defaults to KIVI's G = 32 (KIVI §4, "group size 32" in its experiments). KIVI also keeps its most
recent R tokens in full precision (a residual, for streaming decode); a hand-off ships a finished prefill, so
there is no residual here: every token is quantised.

Layout the codec sees: [..., tokens, head_dim], whose leading dims flatten to rows; the first rows // 2 rows are
keys and the rest values (a layer's chunk is [2·kv_heads, tokens, head_dim], K heads then V heads:
`agents/common/kv_frames.py: as_rows`). A known limit: a layer larger than one chunk (8 MiB: at full size, a
prompt over 2,048 tokens of llama3-8b) is cut into row ranges (`kv_frames.row_slices`), and such a chunk may hold
only keys, only values, or split them off-centre; it still decodes within half a step, but its rows are then
not grouped by KIVI's rule. Cutting chunks at the key/value boundary and saying which half a chunk holds is
the fix (the wire's chunk header, not this codec).

A ragged last group (tokens or head_dim not a multiple of the group) is padded with its own last value for the
min/max only: padding changes no group's range and never reaches the wire.

Payload (uint8), exact: the codes, x.size of them in the input's C order, packed little-endian (2-bit: four a
byte, the first in the low bits; 3-bit: eight codes in three bytes, a 24-bit little-endian word, the first code
in the low bits), ⌈size·bits/8⌉ bytes; then the float16 steps of every key group, then of every value group;
then the float16 zero points in the same order. 4 bytes per group.

The stored zero is the float16 at or below the group's minimum and the stored step the float16 at or above what
covers the maximum from there, so every value of a group lies in [zero, zero + (2^bits − 1)·step] and decodes
within half a step of itself (plus float32 arithmetic). Rounding and the min/max comparisons are not in the
module's published set (docs/reference.md §5): the codec runs on the host, or is refused, by policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KIVI_GROUP = 32  # KIVI's group size G (arXiv:2402.02750 §4)
KIVI_BITS = (2, 3)
GROUP_BYTES = 4  # a float16 step and a float16 zero point per group


def levels(bits: int) -> int:
    """The largest code: 2^bits − 1."""
    return (1 << bits) - 1


@dataclass(frozen=True)
class KiviLayout:
    """How an array of `shape` splits into key rows, value rows and groups."""

    shape: tuple[int, ...]
    group: int

    @property
    def tokens(self) -> int:
        return self.shape[-2]

    @property
    def head_dim(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-2])

    @property
    def key_rows(self) -> int:
        return self.rows // 2

    @property
    def value_rows(self) -> int:
        return self.rows - self.key_rows

    @property
    def key_groups(self) -> int:
        """Per channel, ⌈tokens / group⌉ groups along tokens."""
        return self.key_rows * self.head_dim * math.ceil(self.tokens / self.group)

    @property
    def value_groups(self) -> int:
        """Per token, ⌈head_dim / group⌉ groups along channels."""
        return self.value_rows * self.tokens * math.ceil(self.head_dim / self.group)

    @property
    def groups(self) -> int:
        return self.key_groups + self.value_groups

    def code_bytes(self, bits: int) -> int:
        return math.ceil(math.prod(self.shape) * bits / 8)

    def payload_bytes(self, bits: int) -> int:
        return self.code_bytes(bits) + GROUP_BYTES * self.groups


def _padded(x: np.ndarray, axis: int, group: int) -> np.ndarray:
    """x with `axis` grown to whole groups by repeating its last value (min/max unchanged)."""
    pad = -x.shape[axis] % group
    if pad == 0:
        return x
    if x.size == 0:  # nothing to repeat (no rows): an empty array of the padded shape
        shape = list(x.shape)
        shape[axis] += pad
        return np.zeros(shape, x.dtype)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return np.pad(x, widths, mode="edge")


def _f16_down(v: np.ndarray) -> np.ndarray:
    """The largest float16 at or below each float32 value (−inf below float16's range)."""
    with np.errstate(over="ignore"):
        h = v.astype(np.float16)
    above = h.astype(np.float32) > v
    h[above] = np.nextafter(h[above], np.float16(-np.inf))
    return h


def _f16_up(v: np.ndarray) -> np.ndarray:
    """The smallest float16 at or above each float32 value (+inf above float16's range)."""
    with np.errstate(over="ignore"):
        h = v.astype(np.float16)
    below = h.astype(np.float32) < v
    h[below] = np.nextafter(h[below], np.float16(np.inf))
    return h


def _group_params(mn: np.ndarray, mx: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(step, zero) as float16, covering [mn, mx] (see the module docstring). Non-finite where the input is."""
    zero = _f16_down(mn)
    with np.errstate(invalid="ignore", over="ignore"):
        step = _f16_up((mx - zero.astype(np.float32)) / np.float32(levels(bits)))
    return step, zero


def _quantise(x: np.ndarray, step: np.ndarray, zero: np.ndarray, bits: int) -> np.ndarray:
    """Codes of x for broadcast step/zero (float32 views); a zero step (a constant group) codes 0."""
    s = step.astype(np.float32)
    inv = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
    q = np.rint((x - zero.astype(np.float32)) * inv)
    codes: np.ndarray = np.clip(q, 0, levels(bits)).astype(np.uint8)
    return codes


def _split(x: np.ndarray, layout: KiviLayout) -> tuple[np.ndarray, np.ndarray]:
    rows = x.reshape(layout.rows, layout.tokens, layout.head_dim)
    return rows[: layout.key_rows], rows[layout.key_rows :]


def encode(x: np.ndarray, bits: int, group: int) -> np.ndarray:
    """uint8 payload of x (any float dtype) as the module docstring lays it out. Non-finite input gives
    non-finite steps or zeros, which the caller checks (`registry.py`)."""
    layout = KiviLayout(tuple(x.shape), group)
    keys, values = _split(x.astype(np.float32, copy=False), layout)
    d, g = layout.head_dim, group
    # Keys: [rows, ⌈T/G⌉, G, D], min/max over the G tokens of each channel.
    nt, nd = math.ceil(layout.tokens / g), math.ceil(d / g)
    kp = _padded(keys, 1, g).reshape(layout.key_rows, nt, g, d)
    k_step, k_zero = _group_params(kp.min(axis=2, initial=np.inf), kp.max(axis=2, initial=-np.inf), bits)
    # Values: [rows, T, ⌈D/G⌉, G], min/max over the G channels of each token.
    vp = _padded(values, 2, g).reshape(layout.value_rows, layout.tokens, nd, g)
    v_step, v_zero = _group_params(vp.min(axis=3, initial=np.inf), vp.max(axis=3, initial=-np.inf), bits)
    with np.errstate(invalid="ignore"):  # a non-finite group is reported by the caller
        k_codes = _quantise(kp, k_step[:, :, None, :], k_zero[:, :, None, :], bits)
        v_codes = _quantise(vp, v_step[..., None], v_zero[..., None], bits)
    k_codes = k_codes.reshape(layout.key_rows, nt * g, d)[:, : layout.tokens]
    v_codes = v_codes.reshape(layout.value_rows, layout.tokens, nd * g)[:, :, :d]
    codes = np.concatenate([k_codes.reshape(-1), v_codes.reshape(-1)])
    groups = [a.reshape(-1) for a in (k_step, v_step, k_zero, v_zero)]
    return np.concatenate([pack(codes, bits), np.concatenate(groups).astype(np.float16).view(np.uint8)])


def group_params(payload: np.ndarray, layout: KiviLayout, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, zeros) float16 from a payload, key groups then value groups."""
    start = layout.code_bytes(bits)
    n = layout.groups
    params = payload[start : start + 4 * n].view(np.float16)
    return params[:n], params[n:]


def decode(payload: np.ndarray, shape: tuple[int, ...], bits: int, group: int) -> np.ndarray:
    """float32 values in `shape` from a payload of exactly `KiviLayout(shape, group).payload_bytes(bits)`."""
    layout = KiviLayout(shape, group)
    size = math.prod(shape)
    codes = unpack(payload[: layout.code_bytes(bits)], size, bits).astype(np.float32)
    steps, zeros = (p.astype(np.float32) for p in group_params(payload, layout, bits))
    d, g, t = layout.head_dim, group, layout.tokens
    nk = layout.key_rows * t * d
    k_groups_t = math.ceil(t / g)
    k_step = steps[: layout.key_groups].reshape(layout.key_rows, k_groups_t, 1, d)
    k_zero = zeros[: layout.key_groups].reshape(layout.key_rows, k_groups_t, 1, d)
    keys = _padded(codes[:nk].reshape(layout.key_rows, t, d), 1, g).reshape(layout.key_rows, k_groups_t, g, d)
    keys = (keys * k_step + k_zero).reshape(layout.key_rows, k_groups_t * g, d)[:, :t]
    v_groups_d = math.ceil(d / g)
    v_step = steps[layout.key_groups :].reshape(layout.value_rows, t, v_groups_d, 1)
    v_zero = zeros[layout.key_groups :].reshape(layout.value_rows, t, v_groups_d, 1)
    values = _padded(codes[nk:].reshape(layout.value_rows, t, d), 2, g).reshape(layout.value_rows, t, v_groups_d, g)
    values = (values * v_step + v_zero).reshape(layout.value_rows, t, v_groups_d * g)[:, :, :d]
    return np.concatenate([keys.reshape(-1), values.reshape(-1)]).reshape(shape)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes (each < 2^bits) packed little-endian into exactly ⌈n·bits/8⌉ bytes."""
    n = codes.size
    nbytes = math.ceil(n * bits / 8)
    if bits == 2:
        flat = np.zeros(4 * math.ceil(n / 4), np.uint8)
        flat[:n] = codes
        c = flat.reshape(-1, 4)
        return (c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)).astype(np.uint8)
    if bits == 3:
        flat32 = np.zeros(8 * math.ceil(n / 8), np.uint32)
        flat32[:n] = codes
        c32 = flat32.reshape(-1, 8)
        word = np.zeros(c32.shape[0], np.uint32)
        for i in range(8):
            word |= c32[:, i] << np.uint32(3 * i)
        out = np.empty((word.size, 3), np.uint8)
        out[:, 0] = word & 0xFF
        out[:, 1] = (word >> 8) & 0xFF
        out[:, 2] = (word >> 16) & 0xFF
        return out.reshape(-1)[:nbytes]  # trailing bytes of a ragged last word hold only padding
    raise ValueError(f"kivi: bits must be one of {KIVI_BITS}, got {bits}")


def unpack(packed: np.ndarray, n: int, bits: int) -> np.ndarray:
    """The n uint8 codes `pack` packed."""
    if bits == 2:
        out = np.empty((packed.size, 4), np.uint8)
        for i in range(4):
            out[:, i] = (packed >> (2 * i)) & 0x3
        return out.reshape(-1)[:n]
    if bits == 3:
        words = math.ceil(n / 8)
        flat = np.zeros(3 * words, np.uint32)
        flat[: packed.size] = packed
        b = flat.reshape(-1, 3)
        word = b[:, 0] | (b[:, 1] << np.uint32(8)) | (b[:, 2] << np.uint32(16))
        out = np.empty((words, 8), np.uint8)
        for i in range(8):
            out[:, i] = (word >> np.uint32(3 * i)) & 0x7
        return out.reshape(-1)[:n]
    raise ValueError(f"kivi: bits must be one of {KIVI_BITS}, got {bits}")
