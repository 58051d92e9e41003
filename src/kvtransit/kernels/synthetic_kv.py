"""Synthetic KV caches: deterministic per (seed, request id), shaped like real ones, and cheap to make.

Real K and V (docs/reference.md §6) are not white noise, and a band-keep codec's error depends on that:
- every channel has its own offset (K especially: a few outlier channels sit far from zero);
- K varies smoothly along the tokens (rotary position and slowly drifting content), so most of its energy sits
  in low frequencies along the token axis;
- V is rougher: a weaker smooth part under a large token-to-token part;
- the first token of a sequence (the attention sink) stands apart from the rest.

Speed matters more than statistics here: a prefill agent must turn out ~200 MB/s of KV on one core, which is
memcpy speed, not random-number speed. So each process builds a small bank of templates once (from the
scenario's seed alone, so every process builds the same bank) and makes each request's layer by copying a
window of a template at an offset hashed from (seed, request id, layer), then writing the sink row. The
decode side calls the very same function to regenerate a request's KV and measure the codec's error.

Layout per layer: [2 (K, V), kv_heads, tokens, head_dim], BF16 (ml_dtypes), C-contiguous; tokens on axis -2.
"""

from __future__ import annotations

import numpy as np
from ml_dtypes import bfloat16

from kvtransit.kernels.errors import KernelInputError

# Tokens per template: long enough that a typical prompt (docs/reference.md §4: mean 2,048) is one plain slice;
# longer prompts wrap around (still smooth at the seam: the template is periodic along tokens).
BANK_TOKENS = 4096
# Distinct templates in the bank; layer l uses template l mod this, at its own offset.
BANK_TEMPLATES = 4

# Shape of the structure (chosen so K is markedly smoother than V, as measured on SmolLM2 in docs/reference.md §6,
# where keep-0.5 band-keep left ~0.27 relative error on K and ~0.57 on V).
K_CORNER_TOKENS = 10.0  # K's spectrum falls off beyond a period of ~10 tokens
V_CORNER_TOKENS = 3.0
V_SMOOTH_SHARE = 0.7  # share of V's variance in its smooth part
K_OFFSET_SCALE = 1.0  # per-channel offsets, in units of the varying part's standard deviation
V_OFFSET_SCALE = 0.2
SINK_SCALE = 4.0  # the sink token's magnitude relative to the rest


def _splitmix64(x: int) -> int:
    """A fixed, well-mixed 64-bit hash (Steele et al., SplitMix64): the same offsets on every process."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _periodic_lowpass(rng: np.random.Generator, shape: tuple[int, ...], tokens: int, corner: float) -> np.ndarray:
    """Unit-variance noise, periodic along axis -2, with a first-order low-pass spectrum of the given corner."""
    white = rng.standard_normal((*shape[:-2], tokens, shape[-1])).astype(np.float32)
    spectrum = np.fft.rfft(white, axis=-2)
    freqs = np.fft.rfftfreq(tokens)  # cycles per token
    gain = 1.0 / np.sqrt(1.0 + (freqs * corner) ** 2)
    smooth = np.fft.irfft(spectrum * gain[:, None], n=tokens, axis=-2).astype(np.float32)
    smooth /= smooth.std(axis=-2, keepdims=True) + 1e-12
    return smooth


class SyntheticKv:
    """A bank of KV templates for one layout and seed; `layer(...)` and `request(...)` cut requests from it."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, seed: int, *, bank_tokens: int = BANK_TOKENS,
                 templates: int = BANK_TEMPLATES, sample_path: str | None = None) -> None:
        for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                            ("bank_tokens", bank_tokens), ("templates", templates)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KernelInputError(f"synthetic KV: {name} must be a positive integer, got {value!r}")
        self.layers, self.kv_heads, self.head_dim, self.seed = layers, kv_heads, head_dim, seed
        self.bank_tokens = bank_tokens
        if sample_path:
            self._bank, self._sinks = _bank_from_sample(sample_path, kv_heads, head_dim, bank_tokens)
            return
        rng = np.random.default_rng([0x4B56, seed & 0xFFFFFFFF])
        shape = (kv_heads, bank_tokens, head_dim)
        bank = np.empty((templates, 2, *shape), dtype=bfloat16)
        sinks = np.empty((templates, 2, kv_heads, 1, head_dim), dtype=bfloat16)
        for t in range(templates):
            k = _periodic_lowpass(rng, shape, bank_tokens, K_CORNER_TOKENS)
            k += K_OFFSET_SCALE * rng.standard_normal((kv_heads, 1, head_dim)).astype(np.float32)
            v_smooth = _periodic_lowpass(rng, shape, bank_tokens, V_CORNER_TOKENS)
            v_rough = rng.standard_normal(shape).astype(np.float32)
            v = np.sqrt(V_SMOOTH_SHARE) * v_smooth + np.sqrt(1 - V_SMOOTH_SHARE) * v_rough
            v += V_OFFSET_SCALE * rng.standard_normal((kv_heads, 1, head_dim)).astype(np.float32)
            bank[t, 0], bank[t, 1] = k.astype(bfloat16), v.astype(bfloat16)
            sinks[t] = (SINK_SCALE * rng.standard_normal((2, kv_heads, 1, head_dim))).astype(bfloat16)
        self._bank = bank
        self._sinks = sinks

    def layer_shape(self, tokens: int) -> tuple[int, int, int, int]:
        return (2, self.kv_heads, tokens, self.head_dim)

    def _offset(self, request_id: int, layer: int) -> int:
        key = _splitmix64(_splitmix64(_splitmix64(self.seed & 0xFFFFFFFFFFFFFFFF) ^ request_id) ^ layer)
        return key % self.bank_tokens

    def layer(self, request_id: int, layer: int, tokens: int, out: np.ndarray | None = None, *,
              first: int = 0) -> np.ndarray:
        """Layer `layer` of request `request_id`'s KV for `tokens` tokens from token `first` on: [2, kv_heads, tokens,
        head_dim] BF16, the same values as those tokens of the request's whole KV (a write-back of a prompt's last
        blocks makes only them)."""
        if not 0 <= layer < self.layers:
            raise KernelInputError(f"synthetic KV: layer must be in 0..{self.layers - 1}, got {layer}")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise KernelInputError(f"synthetic KV: tokens must be a positive integer, got {tokens!r}")
        shape = self.layer_shape(tokens)
        if out is None:
            out = np.empty(shape, dtype=bfloat16)
        elif out.shape != shape or out.dtype != bfloat16:
            raise KernelInputError(f"synthetic KV: out must be {shape} bfloat16, got {out.shape} {out.dtype}")
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise KernelInputError(f"synthetic KV: first must be a whole number >= 0, got {first!r}")
        template = self._bank[layer % len(self._bank)]
        start, filled = (self._offset(request_id, layer) + first) % self.bank_tokens, 0
        while filled < tokens:  # one slice for a prompt within the bank; wrap around for longer ones
            n = min(tokens - filled, self.bank_tokens - start)
            out[:, :, filled:filled + n, :] = template[:, :, start:start + n, :]
            filled += n
            start = 0
        if first == 0:
            out[:, :, :1, :] = self._sinks[layer % len(self._sinks)]
        return out

    def request(self, request_id: int, tokens: int) -> list[np.ndarray]:
        """Every layer of one request, in order."""
        return [self.layer(request_id, layer, tokens) for layer in range(self.layers)]


def _bank_from_sample(path: str, kv_heads: int, head_dim: int, bank_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Templates cut from real KV (`tests/data/smollm2_kv_sample.npz`: `{text}.k` / `{text}.v`, each
    [layers, heads, tokens, head_dim]). Each template is one (text, layer) of the sample; our channels take the
    real channels in turn (cycling when we have more); the tokens after the first are mirror-tiled (x, reversed
    x, x, …) so the series stays continuous at every seam; the real first token is the sink row."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise KernelInputError(f"KV sample {path!r}: cannot read it ({exc})") from None
    texts = sorted(key[:-2] for key in data.files if key.endswith(".k") and f"{key[:-2]}.v" in data.files)
    if not texts:
        raise KernelInputError(f"KV sample {path!r}: no '<text>.k' and '<text>.v' arrays in it")
    pairs = [(data[f"{t}.k"], data[f"{t}.v"]) for t in texts]
    sources = [(k[layer], v[layer]) for k, v in pairs for layer in range(k.shape[0])]
    channels = kv_heads * head_dim
    bank = np.empty((len(sources), 2, kv_heads, bank_tokens, head_dim), dtype=bfloat16)
    sinks = np.empty((len(sources), 2, kv_heads, 1, head_dim), dtype=bfloat16)
    for t, pair in enumerate(sources):
        for part, real in enumerate(pair):  # real: [heads, tokens, head_dim]
            series = np.moveaxis(real.astype(np.float32), 1, 0).reshape(real.shape[1], -1)  # [tokens, channels]
            picked = series[:, np.arange(channels) % series.shape[1]]
            body = picked[1:]
            period = np.concatenate([body, body[::-1]])
            tiled = np.resize(period, (bank_tokens, channels))  # repeats the mirrored period
            bank[t, part] = tiled.reshape(bank_tokens, kv_heads, head_dim).transpose(1, 0, 2).astype(bfloat16)
            sinks[t, part] = picked[:1].reshape(1, kv_heads, head_dim).transpose(1, 0, 2).astype(bfloat16)
    return bank, sinks
