"""Band-keep: an orthonormal transform along the token axis in blocks, keep a fixed low band (REFERENCE §6).

Layout: any array `[..., tokens, head_dim]` (one layer's `[2, kv_heads, T, D]`, the whole hand-off's
`[layers, 2, kv_heads, T, D]`, ...). The token axis is -2. The first `sinks` tokens travel exact; the rest
is cut into blocks of `n` tokens (a ragged last block of `tail < n` tokens gets its own transform of length
`tail`), each block is transformed along tokens, and the first `kept_count(n, keep)` *real* coefficients of
each block are kept. The inverse zero-fills the dropped coefficients and transforms back.

Two orthonormal real transforms of length n, both computed with one real FFT (the module's op set):

* ``dct``: DCT-II, norm="ortho" (what FreqKV uses), by Makhoul's method: reorder
  v = [x0, x2, x4, …, x5, x3, x1], V = rFFT(v), y_k = 2·f_k·Re(e^{-iπk/2n}·V_k), f_0 = √(1/4n),
  f_k = √(1/2n) (equals scipy.fft.dct(x, norm="ortho"); V_k for k > n/2 is conj(V_{n-k})).
  The inverse rebuilds V_k = e^{iπk/2n}·(Y_k − i·Y_{n−k})/2 from Y = y/f (Y_n = 0), inverse rFFT, un-reorder.
* ``fft``: the real Fourier basis, in FFTPACK's half-complex order, orthonormal:
  c = [Re V0, √2·Re V1, √2·Im V1, √2·Re V2, √2·Im V2, …, (Re V_{n/2} for even n)] / √n.
  An rFFT of n reals has n/2+1 complex bins = n+2 reals, two of them always zero (Im V0, Im V_{n/2}); this
  order holds exactly n reals, so "keep half" keeps n/2 *real* values (REFERENCE §6), not n/2 bins.

Both are orthonormal, so on white noise the relative error of keeping k of n is √(1 − k/n) exactly in
expectation, and keep = 1 round-trips to float32 rounding.

Arithmetic is float32 whatever the wire dtype (bfloat16, float16, float32); the payload holds the sink
tokens then the kept coefficients, in the wire dtype, as one C-contiguous array `[..., kept_tokens, D]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np

from .errors import KernelInputError
from .fft_backends import FFTBackend

VARIANTS: tuple[str, ...] = ("dct", "fft")
# FreqKV keeps 4 attention-sink tokens exact (arXiv:2505.00570, via REFERENCE §6).
DEFAULT_SINKS = 4
DEFAULT_BLOCK = 64
DEFAULT_KEEP = 0.5  # FreqKV's γ = 0.5 (REFERENCE §6)


def kept_count(n: int, keep: float) -> int:
    """Real coefficients kept of a length-n block: ⌈keep·n⌉, at least 1 (the mean always travels)."""
    # The 1e-9 keeps 0.5·64 = 32 from becoming 33 through float error in keep.
    return min(n, max(1, math.ceil(keep * n - 1e-9)))


# --- Per-(n, kept) constant vectors, shaped (kept, 1) to broadcast over head_dim -------------------------

@lru_cache(maxsize=256)
def _dct_constants(n: int, kept: int):
    """Forward weights a, b (y_j = a_j·Re V_src + b_j·Im V_src), the source bins, and f_j."""
    j = np.arange(kept)
    f = np.where(j == 0, math.sqrt(1 / (4 * n)), math.sqrt(1 / (2 * n)))
    theta = np.pi * j / (2 * n)
    upper = j > n // 2  # these bins are conj(V_{n-j})
    src = np.where(upper, n - j, j)
    a = 2 * f * np.cos(theta)
    b = np.where(upper, -1.0, 1.0) * 2 * f * np.sin(theta)
    col = lambda v: np.ascontiguousarray(v, dtype=np.float32)[:, None]  # noqa: E731
    return col(a), col(b), src, f


# --- Fast bfloat16 <-> float32 (ml_dtypes' casts run at a few hundred MB/s; these are integer ops) ------

BF16 = np.dtype(ml_dtypes.bfloat16)


def as_float32(x: np.ndarray) -> np.ndarray:
    """x as float32 (a copy unless it already is). bfloat16 is the top half of a float32: shift it up."""
    if x.dtype == np.float32:
        return x
    if x.dtype == BF16:
        return (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def store(dest: np.ndarray, values: np.ndarray) -> None:
    """dest[...] = values (float32), rounding to dest's dtype; bfloat16 rounds to nearest even.

    (The integer rounding keeps the canonical NaN an FFT produces a NaN; the caller's finite check sees it.)"""
    if dest.dtype != BF16:
        dest[...] = values
        return
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    dest.view(np.uint16)[...] = rounded


def all_finite(x: np.ndarray) -> bool:
    """No NaN or Inf in x; for bfloat16 by its exponent bits (ml_dtypes' isfinite is slow)."""
    if x.dtype == BF16:
        return not np.any((x.view(np.uint16) & np.uint16(0x7F80)) == np.uint16(0x7F80))
    return bool(np.isfinite(x).all())


# --- Forward / inverse on blocks [..., nb, n, D] (float32 out) --------------------------------------------

def forward_blocks(blocks: np.ndarray, variant: str, kept: int, backend: FFTBackend) -> np.ndarray:
    """The first `kept` real coefficients of each block: [..., nb, n, D] (any float dtype) → [..., nb, kept, D] float32."""
    n = blocks.shape[-2]
    if variant == "dct":
        h = (n + 1) // 2  # v[:h] = x[0::2], v[h:] = x[1::2] reversed
        if blocks.dtype == BF16:
            blocks = as_float32(blocks)
        v = np.empty(blocks.shape, np.float32)
        v[..., :h, :] = blocks[..., 0::2, :]
        v[..., h:, :] = blocks[..., 1::2, :][..., ::-1, :]
        spectrum = backend.rfft(v, axis=-2)
        return _dct_pack(spectrum, n, kept)
    x = as_float32(blocks)
    return _fourier_pack(backend.rfft(x, axis=-2), n, kept)


def inverse_blocks(coef: np.ndarray, variant: str, n: int, backend: FFTBackend) -> np.ndarray:
    """Zero-fill the dropped coefficients and transform back: [..., nb, kept, D] → [..., nb, n, D] float32.

    For ``dct`` the result is still in the reordered order v (see `unreorder_into`)."""
    coef = as_float32(coef)
    spectrum = np.zeros(coef.shape[:-2] + (n // 2 + 1, coef.shape[-1]), np.complex64)
    if variant == "dct":
        _dct_unpack(coef, n, spectrum)
    else:
        _fourier_unpack(coef, n, spectrum)
    return backend.irfft(spectrum, n=n, axis=-2)


def reorder_back(v: np.ndarray) -> np.ndarray:
    """Undo the DCT's reorder: x[0::2] = v[:h], x[1::2] = v[h:] reversed."""
    h = (v.shape[-2] + 1) // 2
    x = np.empty_like(v)
    x[..., 0::2, :] = v[..., :h, :]
    x[..., 1::2, :] = v[..., h:, :][..., ::-1, :]
    return x


def _fourier_counts(n: int, kept: int) -> tuple[int, int]:
    """How many kept reals are real parts of bins 1.. (odd j) and imaginary parts (even j ≥ 2)."""
    return kept // 2, (kept - 1) // 2


def _fourier_pack(spectrum: np.ndarray, n: int, kept: int) -> np.ndarray:
    coef = np.empty(spectrum.shape[:-2] + (kept, spectrum.shape[-1]), np.float32)
    inv_sqrt_n = np.float32(1 / math.sqrt(n))
    edge = np.float32(math.sqrt(2 / n))
    n_re, n_im = _fourier_counts(n, kept)
    np.multiply(spectrum.real[..., 0, :], inv_sqrt_n, out=coef[..., 0, :])
    if n_re:
        np.multiply(spectrum.real[..., 1 : 1 + n_re, :], edge, out=coef[..., 1::2, :])
        if n % 2 == 0 and kept == n:  # the Nyquist bin is real and carries no √2
            coef[..., n - 1, :] *= np.float32(1 / math.sqrt(2))
    if n_im:
        np.multiply(spectrum.imag[..., 1 : 1 + n_im, :], edge, out=coef[..., 2::2, :])
    return coef


def _fourier_unpack(coef: np.ndarray, n: int, spectrum: np.ndarray) -> None:
    kept = coef.shape[-2]
    sqrt_n = np.float32(math.sqrt(n))
    edge = np.float32(math.sqrt(n / 2))
    n_re, n_im = _fourier_counts(n, kept)
    re, im = spectrum.real, spectrum.imag
    np.multiply(coef[..., 0, :], sqrt_n, out=re[..., 0, :])
    if n_re:
        np.multiply(coef[..., 1::2, :], edge, out=re[..., 1 : 1 + n_re, :])
        if n % 2 == 0 and kept == n:
            re[..., n // 2, :] *= np.float32(math.sqrt(2))
    if n_im:
        np.multiply(coef[..., 2::2, :], edge, out=im[..., 1 : 1 + n_im, :])


def _dct_pack(spectrum: np.ndarray, n: int, kept: int) -> np.ndarray:
    a, b, src, _ = _dct_constants(n, kept)
    m = n // 2 + 1
    low = min(kept, m)
    coef = np.empty(spectrum.shape[:-2] + (kept, spectrum.shape[-1]), np.float32)
    head = coef[..., :low, :]
    np.multiply(spectrum.real[..., :low, :], a[:low], out=head)
    head += spectrum.imag[..., :low, :] * b[:low]
    if kept > m:  # keep > 1/2: bins above n/2 are mirrored conjugates
        sel = spectrum[..., src[m:], :]
        coef[..., m:, :] = sel.real * a[m:] + sel.imag * b[m:]
    return coef


def _dct_unpack(coef: np.ndarray, n: int, spectrum: np.ndarray) -> None:
    kept = coef.shape[-2]
    _, _, _, f = _dct_constants(n, kept)
    m = n // 2 + 1
    j = np.arange(kept)
    theta = np.pi * j / (2 * n)
    half_y = coef / (2 * f.astype(np.float32))[:, None]  # Y_j / 2, Y the unnormalised DCT-II
    re, im = spectrum.real, spectrum.imag
    low = min(kept, m)  # V_k gets Y_k·e^{iθ_k}/2 …
    re[..., :low, :] = half_y[..., :low, :] * np.cos(theta[:low]).astype(np.float32)[:, None]
    im[..., :low, :] = half_y[..., :low, :] * np.sin(theta[:low]).astype(np.float32)[:, None]
    mirrored = j[(j >= n - n // 2) & (j >= 1)]  # … and −i·Y_{n−k}·e^{iθ_k}/2 from kept j = n − k
    if mirrored.size:
        k = n - mirrored
        tk = (np.pi * k / (2 * n)).astype(np.float32)[:, None]
        re[..., k, :] += half_y[..., mirrored, :] * np.sin(tk)
        im[..., k, :] -= half_y[..., mirrored, :] * np.cos(tk)


# --- The whole-array codec ------------------------------------------------------------------------------

@dataclass(frozen=True)
class BandKeepLayout:
    """Everything decode needs besides the payload; what the header carries for freq-keep-k."""

    shape: tuple[int, ...]
    block: int
    sinks: int
    kept_block: int  # kept reals per full block
    kept_tail: int  # kept reals of the ragged last block (0 when there is none)
    variant: str

    @property
    def tokens(self) -> int:
        return self.shape[-2]

    @property
    def full_blocks(self) -> int:
        return (self.tokens - self.sinks) // self.block

    @property
    def tail(self) -> int:
        return (self.tokens - self.sinks) % self.block

    @property
    def kept_tokens(self) -> int:
        return self.sinks + self.full_blocks * self.kept_block + self.kept_tail

    @property
    def payload_shape(self) -> tuple[int, ...]:
        return self.shape[:-2] + (self.kept_tokens, self.shape[-1])

    def check(self) -> None:
        """Reject a layout no encoder could have produced (a corrupt or foreign header)."""
        if len(self.shape) < 2 or self.block < 2 or self.variant not in VARIANTS:
            raise KernelInputError(f"band-keep header: bad layout {self}")
        if not (0 <= self.sinks <= self.tokens and 1 <= self.kept_block <= self.block):
            raise KernelInputError(f"band-keep header: sinks/kept out of range in {self}")
        if not ((self.tail == 0 and self.kept_tail == 0) or 1 <= self.kept_tail <= self.tail):
            raise KernelInputError(f"band-keep header: kept_tail {self.kept_tail} does not fit tail {self.tail}")


def layout_for(shape: tuple[int, ...], keep: float, block: int, sinks: int, variant: str) -> BandKeepLayout:
    if len(shape) < 2:
        raise KernelInputError(f"band-keep needs [..., tokens, head_dim] (>= 2 dims), got shape {shape}")
    tokens = shape[-2]
    if sinks > tokens:
        raise KernelInputError(f"sinks={sinks} is larger than the sequence ({tokens} tokens, axis -2 of {shape})")
    tail = (tokens - sinks) % block
    return BandKeepLayout(tuple(shape), block, sinks, kept_count(block, keep),
                          kept_count(tail, keep) if tail else 0, variant)


def _split_tokens(view: np.ndarray, nb: int, n: int) -> np.ndarray:
    """[..., nb·n, D] → [..., nb, n, D] as a view (splitting one strided axis never needs a copy)."""
    split = view.reshape(view.shape[:-2] + (nb, n, view.shape[-1]))
    assert np.shares_memory(split, view) or split.size == 0
    return split


def _add_precision_noise(coef: np.ndarray, bits: int, rng: np.random.Generator) -> None:
    """Model the analogue path's limited precision as the noise of a `bits`-bit uniform quantiser.

    Full scale FS = the block's largest |coefficient|; step Δ = 2·FS / 2^bits; noise uniform in ±Δ/2
    (RMS Δ/√12), which gives a full-scale sine SNR = 6.02·bits + 1.76 dB, the ENOB definition.
    """
    full_scale = np.abs(coef).max(axis=(-2, -1), keepdims=True)
    step = (2.0 * full_scale / np.float32(2.0**bits)).astype(np.float32)
    coef += (rng.random(coef.shape, dtype=np.float32) - np.float32(0.5)) * step


def encode(kv: np.ndarray, layout: BandKeepLayout, backend: FFTBackend,
           precision_bits: int | None = None, seed: int = 0) -> np.ndarray:
    """The payload [..., kept_tokens, D] in kv's dtype: sink tokens, then each block's kept coefficients."""
    lead, d = kv.shape[:-2], kv.shape[-1]
    s, n, nb, tail = layout.sinks, layout.block, layout.full_blocks, layout.tail
    payload = np.empty(layout.payload_shape, kv.dtype)
    payload[..., :s, :] = kv[..., :s, :]
    rng = np.random.default_rng(seed) if precision_bits else None
    pos = s
    for count, length, kept in ((nb, n, layout.kept_block), (1 if tail else 0, tail, layout.kept_tail)):
        if not count:
            continue
        start = s if length == n else s + nb * n
        blocks = _split_tokens(kv[..., start : start + count * length, :], count, length)
        coef = forward_blocks(blocks, layout.variant, kept, backend)
        if rng is not None:
            _add_precision_noise(coef, precision_bits, rng)
        store(payload[..., pos : pos + count * kept, :], coef.reshape(lead + (count * kept, d)))
        pos += count * kept
    return payload


def decode(payload: np.ndarray, layout: BandKeepLayout, backend: FFTBackend) -> np.ndarray:
    """Rebuild [..., tokens, D] in the payload's dtype from the sinks and the kept coefficients."""
    lead, d = layout.shape[:-2], layout.shape[-1]
    s, n, nb, tail = layout.sinks, layout.block, layout.full_blocks, layout.tail
    out = np.empty(layout.shape, payload.dtype)
    out[..., :s, :] = payload[..., :s, :]
    pos = s
    for count, length, kept in ((nb, n, layout.kept_block), (1 if tail else 0, tail, layout.kept_tail)):
        if not count:
            continue
        start = s if length == n else s + nb * n
        coef = _split_tokens(payload[..., pos : pos + count * kept, :], count, kept)
        x = inverse_blocks(coef, layout.variant, length, backend)
        dest = _split_tokens(out[..., start : start + count * length, :], count, length)
        if layout.variant == "dct":
            x = reorder_back(x)
        store(dest, x)
        pos += count * kept
    return out
