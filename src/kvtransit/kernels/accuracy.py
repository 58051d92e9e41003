"""Accuracy of a codec on KV, measured (docs/reference.md §6): reconstruction error of K and V, attention-output
error for real decode queries, bytes kept, beside equal-memory baselines.

Definitions (all aggregated over every layer, head, token and channel, as Frobenius norms):

* ``k_err`` = ‖K̂ − K‖ / ‖K‖ (same for V).
* ``k_err_centred``: the same with each block's mean (over `block` tokens, per channel) removed from both
  the error and K: ‖E − mean_b(E)‖ / ‖K − mean_b(K)‖. KV has large per-channel offsets that any codec
  keeping the block mean gets for free; this figure judges what is left.
* ``attn_err`` = ‖O − Ô‖ / ‖O‖, O = softmax(q·Kᵀ/√d)·V for each decode query over keys 0..pos (causal),
  query heads grouped onto kv heads (GQA: query head h reads kv head h // (q_heads / kv_heads), as
  transformers' repeat_kv), Ô the same with decoded K and V.
* ``bytes_ratio`` = wire bytes / original bytes in the wire dtype.

Baselines: ``exact`` (the wire dtype's own rounding), ``subsample`` (keep the sinks and every
(1/keep)-th token after them: equal memory; attention runs over the kept tokens only, reconstruction
fills each dropped token with the last kept one), ``int8`` and ``int4`` (symmetric, 32-value groups).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.header import WIRE_DTYPES
from kvtransit.kernels.quant import int_quantise_roundtrip
from kvtransit.kernels.registry import get_codec

SAMPLE_TEXTS = ("prose", "code")


@dataclass(frozen=True)
class KVSample:
    """One text's KV: k, v [layers, kv_heads, T, D]; q [layers, q_heads, Tq, D] and their positions."""

    name: str
    k: np.ndarray
    v: np.ndarray
    q: np.ndarray | None = None
    q_positions: np.ndarray | None = None


@dataclass(frozen=True)
class AccuracyRow:
    method: str
    setting: str
    bytes_ratio: float
    k_err: float
    k_err_centred: float
    v_err: float
    v_err_centred: float
    attn_err: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_sample(path: str) -> dict[str, KVSample]:
    """The committed real-KV sample (SmolLM2-135M): {text: KVSample}, float32. Schema in the module tests."""
    with np.load(path, allow_pickle=False) as data:
        out = {}
        for text in SAMPLE_TEXTS:
            if f"{text}.k" not in data:
                continue
            out[text] = KVSample(text, data[f"{text}.k"].astype(np.float32), data[f"{text}.v"].astype(np.float32),
                                 data[f"{text}.q"].astype(np.float32), data[f"{text}.q_positions"].astype(np.int64))
    if not out:
        raise KernelInputError(f"{path}: no '<text>.k' arrays (expected texts: {', '.join(SAMPLE_TEXTS)})")
    return out


def synthetic_sample(kind: str = "gaussian", *, layers: int = 2, kv_heads: int = 3, q_heads: int = 9,
                     tokens: int = 512, head_dim: int = 64, queries: int = 8, seed: int = 0) -> KVSample:
    """Synthetic KV. ``gaussian``: white noise (band-keep error √(1 − kept/N)). ``structured``: per-channel
    offsets plus an AR(1) process along tokens (ρ = 0.95), a smooth signal like real keys."""
    rng = np.random.default_rng(seed)
    shape = (layers, kv_heads, tokens, head_dim)
    if kind == "gaussian":
        k, v = rng.standard_normal(shape), rng.standard_normal(shape)
    elif kind == "structured":
        def smooth() -> np.ndarray:
            noise = rng.standard_normal(shape)
            x = np.empty(shape)
            x[..., 0, :] = noise[..., 0, :]
            rho = 0.95
            for t in range(1, tokens):
                x[..., t, :] = rho * x[..., t - 1, :] + math.sqrt(1 - rho**2) * noise[..., t, :]
            return x + 2.0 * rng.standard_normal((layers, kv_heads, 1, head_dim))
        k, v = smooth(), smooth()
    else:
        raise KernelInputError(f"unknown synthetic kind {kind!r} (choose from: gaussian, structured)")
    q = rng.standard_normal((layers, q_heads, queries, head_dim))
    positions = np.linspace(tokens // 2, tokens - 1, queries).astype(np.int64)
    return KVSample(f"synthetic-{kind}", k.astype(np.float32), v.astype(np.float32), q.astype(np.float32), positions)


def relative_error(ref: np.ndarray, approx: np.ndarray) -> float:
    ref = ref.astype(np.float64)
    return float(np.linalg.norm(approx.astype(np.float64) - ref) / np.linalg.norm(ref))


def _remove_block_means(x: np.ndarray, block: int) -> np.ndarray:
    t = x.shape[-2]
    out = x.astype(np.float64).copy()
    for start in range(0, t, block):
        seg = out[..., start : start + block, :]
        seg -= seg.mean(axis=-2, keepdims=True)
    return out


def centred_relative_error(ref: np.ndarray, approx: np.ndarray, block: int) -> float:
    err = _remove_block_means(approx.astype(np.float64) - ref, block)
    return float(np.linalg.norm(err) / np.linalg.norm(_remove_block_means(ref, block)))


def attention_outputs(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray,
                      key_positions: np.ndarray | None = None) -> np.ndarray:
    """softmax(q·Kᵀ/√d)·V per decode query, causal over keys at positions ≤ pos, GQA-grouped.

    q [q_heads, Tq, D]; k, v [kv_heads, Tk, D]; key_positions [Tk] (default 0..Tk−1). → [q_heads, Tq, D]."""
    q_heads, kv_heads = q.shape[0], k.shape[0]
    if q_heads % kv_heads:
        raise KernelInputError(f"query heads {q_heads} are not a multiple of kv heads {kv_heads}")
    group = q_heads // kv_heads
    kpos = np.arange(k.shape[1]) if key_positions is None else key_positions
    kk = np.repeat(k.astype(np.float64), group, axis=0)  # [q_heads, Tk, D]: query head h reads kv head h // group
    vv = np.repeat(v.astype(np.float64), group, axis=0)
    scores = np.einsum("hqd,hkd->hqk", q.astype(np.float64), kk) / math.sqrt(q.shape[-1])
    scores = np.where(kpos[None, None, :] <= positions[None, :, None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    w = np.exp(scores)
    w /= w.sum(axis=-1, keepdims=True)
    out: np.ndarray = np.einsum("hqk,hkd->hqd", w, vv)
    return out


def attention_error(sample: KVSample, k_hat: np.ndarray, v_hat: np.ndarray,
                    key_positions: np.ndarray | None = None) -> float | None:
    q, positions = sample.q, sample.q_positions
    if q is None:
        return None
    assert positions is not None  # a sample with queries has their positions
    num = den = 0.0
    for layer in range(sample.k.shape[0]):
        ref = attention_outputs(q[layer], sample.k[layer], sample.v[layer], positions)
        got = attention_outputs(q[layer], k_hat[layer], v_hat[layer], positions, key_positions)
        num += float(np.sum((got - ref) ** 2))
        den += float(np.sum(ref**2))
    return math.sqrt(num / den)


def _row(method: str, setting: str, sample: KVSample, k_hat: np.ndarray, v_hat: np.ndarray, bytes_ratio: float,
         block: int,
         attn: float | None = None, attn_given: bool = False) -> AccuracyRow:
    return AccuracyRow(
        method, setting, bytes_ratio,
        relative_error(sample.k, k_hat), centred_relative_error(sample.k, k_hat, block),
        relative_error(sample.v, v_hat), centred_relative_error(sample.v, v_hat, block),
        attn if attn_given else attention_error(sample, k_hat, v_hat),
    )


def evaluate_codec(sample: KVSample, codec_name: str, *, dtype: str = "bfloat16", centre_block: int = 64,
                   **codec_params: Any) -> AccuracyRow:
    """Encode [layers, 2, kv_heads, T, D] in `dtype` with the codec, decode, and measure."""
    codec = get_codec(codec_name, **codec_params)
    kv = np.stack([sample.k, sample.v], axis=1).astype(WIRE_DTYPES[dtype])
    enc = codec.encode(kv)
    out = codec.decode(enc.header, enc.payload).astype(np.float32)
    setting = ", ".join(f"{k}={v}" for k, v in codec.params.items() if k not in ("backend", "seed") and v is not None)
    return _row(codec_name, setting, sample, out[:, 0], out[:, 1], enc.wire_bytes / kv.nbytes, centre_block)


def codec_roundtrip(codec_name: str, x: np.ndarray) -> tuple[np.ndarray, int]:
    """`x` through the codec `codec_name` (its default parameters) and back: (decoded, in x's shape and dtype; the
    wire bytes it made). What a baseline quantiser does to the very tensors a kernel was measured on."""
    codec = get_codec(codec_name)
    enc = codec.encode(x)
    return codec.decode(enc.header, enc.payload), enc.wire_bytes


def subsample_baseline(sample: KVSample, keep: float, sinks: int, centre_block: int = 64) -> AccuracyRow:
    """Equal memory by dropping tokens: the sinks, then every round(1/keep)-th token."""
    t = sample.k.shape[-2]
    stride = max(1, round(1 / keep))
    kept = np.concatenate([np.arange(min(sinks, t)), np.arange(min(sinks, t), t, stride)])
    hold = kept[np.searchsorted(kept, np.arange(t), side="right") - 1]  # last kept token at or before each t
    k_hat, v_hat = sample.k[..., hold, :], sample.v[..., hold, :]
    attn = None
    q, positions = sample.q, sample.q_positions
    if q is not None:
        assert positions is not None  # a sample with queries has their positions
        sub_k, sub_v = sample.k[..., kept, :], sample.v[..., kept, :]
        num = den = 0.0
        for layer in range(sample.k.shape[0]):
            ref = attention_outputs(q[layer], sample.k[layer], sample.v[layer], positions)
            got = attention_outputs(q[layer], sub_k[layer], sub_v[layer], positions, kept)
            num += float(np.sum((got - ref) ** 2))
            den += float(np.sum(ref**2))
        attn = math.sqrt(num / den)
    return _row("subsample", f"1 token in {stride} + {sinks} sinks", sample, k_hat, v_hat, kept.size / t,
                centre_block, attn, attn_given=True)


def int_baseline(sample: KVSample, bits: int, dtype: str = "bfloat16", centre_block: int = 64) -> AccuracyRow:
    k_hat, kb = int_quantise_roundtrip(sample.k, bits)
    v_hat, vb = int_quantise_roundtrip(sample.v, bits)
    original = 2 * sample.k.size * WIRE_DTYPES[dtype].itemsize
    return _row(f"int{bits}", "symmetric, 32-value groups", sample, k_hat, v_hat, (kb + vb) / original, centre_block)


def accuracy_table(sample: KVSample, codec_name: str = "freq-keep-k", *, dtype: str = "bfloat16",
                   keep: float = 0.5, block: int | None = None, sinks: int = 4, variant: str = "dct",
                   precision_bits: int | None = None, baselines: bool = True) -> list[AccuracyRow]:
    """The codec's row, with (by default) exact, subsample at equal memory, int8 and int4 beside it."""
    centre = block or 64
    params = dict(keep=keep, block=block, sinks=sinks, variant=variant, precision_bits=precision_bits) \
        if codec_name == "freq-keep-k" else ({"block": block} if block is not None else {})
    rows = [evaluate_codec(sample, codec_name, dtype=dtype, centre_block=centre, **params)]
    if baselines:
        rows.insert(0, evaluate_codec(sample, "none", dtype=dtype, centre_block=centre))
        rows[0] = AccuracyRow("exact", dtype, *list(asdict(rows[0]).values())[2:])
        rows += [subsample_baseline(sample, keep, sinks, centre), int_baseline(sample, 8, dtype, centre),
                 int_baseline(sample, 4, dtype, centre)]
    return rows
