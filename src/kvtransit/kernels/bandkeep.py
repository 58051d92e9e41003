"""Band-keep: an orthonormal transform along the token axis in blocks, keep a fixed low band (docs/reference.md §6).

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
  order holds exactly n reals, so "keep half" keeps n/2 *real* values (docs/reference.md §6), not n/2 bins.

Both are orthonormal, so on white noise the relative error of keeping k of n is √(1 − k/n) exactly in
expectation, and keep = 1 round-trips to float32 rounding.

Arithmetic is float32 whatever the wire dtype (bfloat16, float16, float32); the payload holds the sink
tokens then the kept coefficients, in the wire dtype, as one C-contiguous array `[..., kept_tokens, D]`.

Two paths run the same arithmetic: arrays larger than a chunk go through cache-sized chunks (fused reorder and
widen, benchmarks/RESULTS.md "## Kernels"); an array that fits one chunk per group (a one-channel layer of a
few KB, the middlebox's common case at small scale) through a plan made once per layout, so its call is
numpy work, not Python bookkeeping (RESULTS.md "Band-keep on small chunks: per-call overhead").

Why one file of ~800 lines: the forward and inverse transforms, the kept-band layout, the scratch buffers and
both paths must agree to the index (the small-array path to the bit); split apart, they could drift and the
round-trip tests would only find it after the fact.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, lru_cache, partial
from typing import TypeVar, cast

import ml_dtypes
import numpy as np
import numpy.typing as npt

from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.fft_backends import FFTBackend

VARIANTS: tuple[str, ...] = ("dct", "fft")
# FreqKV keeps 4 attention-sink tokens exact (arXiv:2505.00570, via docs/reference.md §6).
DEFAULT_SINKS = 4
DEFAULT_BLOCK = 64
DEFAULT_KEEP = 0.5  # FreqKV's γ = 0.5 (docs/reference.md §6)


def kept_count(n: int, keep: float) -> int:
    """Real coefficients kept of a length-n block: ⌈keep·n⌉, at least 1 (the mean always travels)."""
    # The 1e-9 keeps 0.5·64 = 32 from becoming 33 through float error in keep.
    return min(n, max(1, math.ceil(keep * n - 1e-9)))


# --- Per-(n, kept) constant vectors, shaped (kept, 1) to broadcast over head_dim -------------------------

def _column(v: np.ndarray) -> np.ndarray:
    """A float32 column (kept, 1), contiguous, to broadcast over head_dim."""
    return np.ascontiguousarray(v, dtype=np.float32)[:, None]


@lru_cache(maxsize=256)
def _dct_constants(n: int, kept: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Forward weights a, b (y_j = a_j·Re V_src + b_j·Im V_src), the source bins, and f_j."""
    j = np.arange(kept)
    f = np.where(j == 0, math.sqrt(1 / (4 * n)), math.sqrt(1 / (2 * n)))
    theta = np.pi * j / (2 * n)
    upper = j > n // 2  # these bins are conj(V_{n-j})
    src = np.where(upper, n - j, j)
    a = 2 * f * np.cos(theta)
    b = np.where(upper, -1.0, 1.0) * 2 * f * np.sin(theta)
    return _column(a), _column(b), src, f


# --- Fast bfloat16 <-> float32 (ml_dtypes' casts run at a few hundred MB/s; these are integer ops) ------

BF16 = np.dtype(ml_dtypes.bfloat16)


def store(dest: np.ndarray, values: np.ndarray, scratch: _Scratch | None = None) -> None:
    """dest[...] = values (float32), rounding to dest's dtype; bfloat16 rounds to nearest even.

    (The integer rounding keeps the canonical NaN an FFT produces a NaN; the caller's finite check sees it.)"""
    if dest.dtype != BF16:
        dest[...] = values
        return
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    # In place in one buffer (the caller's scratch when it has one): no temporaries.
    rounded = np.empty(u.shape, np.uint32) if scratch is None else scratch.get("round", u.shape, np.uint32)
    _round_bf16(u, rounded, dest.view(np.uint16))


def _round_bf16(u: np.ndarray, rounded: np.ndarray, dest: np.ndarray) -> None:
    """dest (uint16, any strides) = the bfloat16 bits of float32 bits u, to nearest even, via `rounded` (u's shape)."""
    np.right_shift(u, 16, out=rounded)
    np.bitwise_and(rounded, 1, out=rounded)  # the lsb of the kept half: ties go to even
    rounded += _ROUND_HALF
    rounded += u
    np.right_shift(rounded, 16, out=dest)  # < 2^16: exact in the uint16 output


_ROUND_HALF = np.uint32(0x7FFF)
_BF16_EXPONENT = np.uint16(0x7F80)


def all_finite(x: np.ndarray) -> bool:
    """No NaN or Inf in x; for bfloat16 by its exponent bits (ml_dtypes' isfinite is slow)."""
    if x.dtype == BF16:
        # The largest exponent field is all ones only if some value is NaN/Inf: one pass and one reduction.
        exponents = x.view(np.uint16) & _BF16_EXPONENT
        return exponents.size == 0 or int(exponents.max()) != 0x7F80
    return bool(np.isfinite(x).all())


# --- Per-thread scratch, and the cache-sized chunks the codec works in ------------------------------------
#
# The codec never makes a whole-array temporary. It walks the blocks in chunks of about CHUNK_BYTES of
# float32 input; per chunk it stages (reorders / widens) into a scratch buffer, runs the rFFT into a scratch
# spectrum, and packs the kept coefficients straight into the payload. Staging buffer, spectrum and
# coefficients (about 2.5 × the chunk) then stay in a core's L2 cache between the passes, so main memory
# sees the input read once and the payload written once, and the reused buffers cost no page faults.

CHUNK_BYTES = 256 * 1024  # float32 input per chunk; ~2.5× that must fit a 2 MiB per-core L2 (measured best)

# bfloat16 is the high half of a float32. The staging buffer for bfloat16 input is zeroed once and only its
# high halves are ever written, so writing the bf16 bits there *is* the conversion (no shift pass, no temp).
_HIGH_HALF = 1 if sys.byteorder == "little" else 0


_Built = TypeVar("_Built")
_MAX_PLANNED = 64  # views of this many plans per scratch set; then they are dropped and rebuilt on demand


class _Scratch:
    """Reusable buffers by name. One encode or decode borrows one (`_borrowed_scratch`) for its duration."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}
        self._planned: dict[object, object] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        """A C-contiguous array of `shape` over buffer `name`, grown (zeroed) when too small; contents stale."""
        dtype = np.dtype(dtype)
        need = math.prod(shape) * dtype.itemsize
        buf = self._buffers.get(name)
        if buf is None or buf.nbytes < need:
            buf = np.zeros(max(need, 1), np.uint8)  # zeroed: the bfloat16 stage relies on it (see _HIGH_HALF)
            self._buffers[name] = buf
            # Views built over the old buffer would keep it alive (and stop sharing): rebuild them on demand.
            self._planned.clear()
        view: np.ndarray = buf[:need].view(dtype).reshape(shape)
        return view

    def planned(self, key: object, build: Callable[[_Scratch], _Built]) -> _Built:
        """What `build(self)` makes (views over these buffers), made once per key and kept while they last."""
        found = self._planned.get(key)
        if found is None:
            if len(self._planned) >= _MAX_PLANNED:
                self._planned.clear()
            found = build(self)
            self._planned[key] = found
        return cast(_Built, found)  # each key is only ever built by one `build`


# Idle scratch sets. The middlebox encodes in executor threads, and this pure layer may not use threading:
# list.pop and list.append are atomic, so concurrent calls each get a set of their own (as many sets
# exist as calls ever ran at once).
_idle_scratch: list[_Scratch] = []


def _borrow() -> _Scratch:
    try:
        return _idle_scratch.pop()
    except IndexError:
        return _Scratch()


@contextmanager
def _borrowed_scratch() -> Iterator[_Scratch]:
    scratch = _borrow()
    try:
        yield scratch
    finally:
        _idle_scratch.append(scratch)


def _chunks(rows: int, blocks: int, block_bytes: int) -> Iterator[tuple[slice, slice]]:
    """(row slice, block slice) pairs covering [rows, blocks] in C order, each about CHUNK_BYTES of input."""
    per = max(1, CHUNK_BYTES // max(1, block_bytes))
    if per >= blocks:
        step = per // max(1, blocks)
        for r in range(0, rows, step):
            yield slice(r, min(r + step, rows)), slice(0, blocks)
    else:
        for r in range(rows):
            for b in range(0, blocks, per):
                yield slice(r, r + 1), slice(b, min(b + per, blocks))


# --- Forward / inverse on blocks [..., nb, n, D] (float32 out) --------------------------------------------

def _stage(blocks: np.ndarray, reorder: bool, scratch: _Scratch) -> np.ndarray:
    """blocks as float32, in the DCT's order v = [x0, x2, …, x3, x1] when `reorder`, in one pass.

    float32 input that needs no reorder is used in place (the FFT reads strided views)."""
    if blocks.dtype == np.float32 and not reorder:
        return blocks
    n = blocks.shape[-2]
    h = (n + 1) // 2  # v[:h] = x[0::2], v[h:] = x[1::2] reversed
    if blocks.dtype == BF16:
        v = scratch.get("bf16-stage", blocks.shape, np.float32)
        dest, src = v.view(np.uint16).reshape((*blocks.shape, 2))[..., _HIGH_HALF], blocks.view(np.uint16)
    else:
        v = scratch.get("stage", blocks.shape, np.float32)
        dest, src = v, blocks  # float16 widens in the assignment
    if reorder:
        dest[..., :h, :] = src[..., 0::2, :]
        dest[..., h:, :] = src[..., 1::2, :][..., ::-1, :]
    else:
        dest[...] = src
    return v


def _forward_into(blocks: np.ndarray, variant: str, kept: int, backend: FFTBackend, coef: np.ndarray,
                  scratch: _Scratch) -> None:
    """coef[..., nb, kept, D] (float32) = the first `kept` real coefficients of each block of `blocks`."""
    n = blocks.shape[-2]
    x = _stage(blocks, variant == "dct", scratch)
    spectrum = scratch.get("spectrum", (*x.shape[:-2], n // 2 + 1, x.shape[-1]), np.complex64)
    backend.rfft_into(x, spectrum, axis=-2)
    if variant == "dct":
        _dct_pack(spectrum, n, kept, coef, scratch)
    else:
        _fourier_pack(spectrum, n, kept, coef)


def forward_blocks(blocks: np.ndarray, variant: str, kept: int, backend: FFTBackend) -> np.ndarray:
    """The first `kept` real coefficients of each block: [..., nb, n, D] (any float dtype) → [..., nb, kept, D]
    float32."""
    coef = np.empty((*blocks.shape[:-2], kept, blocks.shape[-1]), np.float32)
    with _borrowed_scratch() as scratch:
        _forward_into(blocks, variant, kept, backend, coef, scratch)
    return coef


def _inverse_into(coef: np.ndarray, variant: str, n: int, backend: FFTBackend, v: np.ndarray,
                  scratch: _Scratch) -> None:
    """v[..., nb, n, D] (float32) = the zero-filled inverse of coef; for ``dct`` still in the reordered order."""
    if coef.dtype != np.float32:
        c = scratch.get("coef-in", coef.shape, np.float32)
        if coef.dtype == BF16:  # widen by integer shift, not ml_dtypes' slow cast
            np.left_shift(coef.view(np.uint16), 16, out=c.view(np.uint32), dtype=np.uint32)
        else:
            c[...] = coef
        coef = c
    spectrum = scratch.get("spectrum", (*coef.shape[:-2], n // 2 + 1, coef.shape[-1]), np.complex64)
    if variant == "dct":
        _dct_unpack(coef, n, spectrum)
    else:
        _fourier_unpack(coef, n, spectrum)
    backend.irfft_into(spectrum, v, n, axis=-2)


def inverse_blocks(coef: np.ndarray, variant: str, n: int, backend: FFTBackend) -> np.ndarray:
    """Zero-fill the dropped coefficients and transform back: [..., nb, kept, D] → [..., nb, n, D] float32.

    For ``dct`` the result is still in the reordered order v (see `reorder_back`)."""
    v = np.empty((*coef.shape[:-2], n, coef.shape[-1]), np.float32)
    with _borrowed_scratch() as scratch:
        _inverse_into(coef, variant, n, backend, v, scratch)
    return v


def _reorder_back_into(v: np.ndarray, x: np.ndarray) -> None:
    h = (v.shape[-2] + 1) // 2
    x[..., 0::2, :] = v[..., :h, :]
    x[..., 1::2, :] = v[..., h:, :][..., ::-1, :]


def reorder_back(v: np.ndarray) -> np.ndarray:
    """Undo the DCT's reorder: x[0::2] = v[:h], x[1::2] = v[h:] reversed."""
    x = np.empty_like(v)
    _reorder_back_into(v, x)
    return x


def _fourier_counts(n: int, kept: int) -> tuple[int, int]:
    """How many kept reals are real parts of bins 1.. (odd j) and imaginary parts (even j ≥ 2)."""
    return kept // 2, (kept - 1) // 2


# The packs and unpacks below are built as lists of steps: ufunc calls bound to the very arrays they read and
# write. The chunked path builds them per chunk and runs them at once; a small array's plan builds them once
# per scratch set and runs them on every call (see "Small arrays"), so both run the same arithmetic.
Step = Callable[[], object]


def _run(steps: list[Step]) -> None:
    for step in steps:
        step()


def _fourier_pack_steps(spectrum: np.ndarray, n: int, kept: int, coef: np.ndarray) -> list[Step]:
    inv_sqrt_n = np.float32(1 / math.sqrt(n))
    edge = np.float32(math.sqrt(2 / n))
    n_re, n_im = _fourier_counts(n, kept)
    steps: list[Step] = [partial(np.multiply, spectrum.real[..., 0, :], inv_sqrt_n, out=coef[..., 0, :])]
    if n_re:
        steps.append(partial(np.multiply, spectrum.real[..., 1 : 1 + n_re, :], edge, out=coef[..., 1::2, :]))
        if n % 2 == 0 and kept == n:  # the Nyquist bin is real and carries no √2
            nyquist = coef[..., n - 1, :]
            steps.append(partial(np.multiply, nyquist, np.float32(1 / math.sqrt(2)), out=nyquist))
    if n_im:
        steps.append(partial(np.multiply, spectrum.imag[..., 1 : 1 + n_im, :], edge, out=coef[..., 2::2, :]))
    return steps


def _fourier_unpack_steps(coef: np.ndarray, n: int, spectrum: np.ndarray) -> list[Step]:
    kept = coef.shape[-2]
    sqrt_n = np.float32(math.sqrt(n))
    edge = np.float32(math.sqrt(n / 2))
    n_re, n_im = _fourier_counts(n, kept)
    re, im = spectrum.real, spectrum.imag
    # Zero only what the kept reals do not overwrite: Im V0, and the bins above the kept ones.
    steps: list[Step] = [partial(im[..., 0, :].fill, 0), partial(re[..., 1 + n_re :, :].fill, 0),
                         partial(im[..., 1 + n_im :, :].fill, 0),
                         partial(np.multiply, coef[..., 0, :], sqrt_n, out=re[..., 0, :])]
    if n_re:
        steps.append(partial(np.multiply, coef[..., 1::2, :], edge, out=re[..., 1 : 1 + n_re, :]))
        if n % 2 == 0 and kept == n:
            nyquist = re[..., n // 2, :]
            steps.append(partial(np.multiply, nyquist, np.float32(math.sqrt(2)), out=nyquist))
    if n_im:
        steps.append(partial(np.multiply, coef[..., 2::2, :], edge, out=im[..., 1 : 1 + n_im, :]))
    return steps


def _fourier_pack(spectrum: np.ndarray, n: int, kept: int, coef: np.ndarray) -> None:
    _run(_fourier_pack_steps(spectrum, n, kept, coef))


def _fourier_unpack(coef: np.ndarray, n: int, spectrum: np.ndarray) -> None:
    _run(_fourier_unpack_steps(coef, n, spectrum))


@lru_cache(maxsize=256)
def _dct_interleaved_weights(n: int, kept: int, d: int) -> np.ndarray:
    """[low, 2·d] float32: (a_j, b_j) repeated along a row, to multiply a spectrum row seen as floats."""
    a, b, _, _ = _dct_constants(n, kept)
    low = min(kept, n // 2 + 1)
    w = np.empty((low, 2 * d), np.float32)
    w[:, 0::2], w[:, 1::2] = a[:low], b[:low]
    return w


def _dct_pack_rows(spectrum: np.ndarray, n: int, kept: int) -> tuple[int, ...]:
    """The shape of `_dct_pack_steps`' products buffer for this spectrum."""
    return (*spectrum.shape[:-2], min(kept, n // 2 + 1), 2 * spectrum.shape[-1])


def _dct_pack_steps(spectrum: np.ndarray, n: int, kept: int, coef: np.ndarray, products: np.ndarray) -> list[Step]:
    """y_j = a_j·Re V_j + b_j·Im V_j, on the kept bins only (the twiddle never touches the dropped ones).

    The spectrum is read as interleaved floats (Re, Im, Re, Im, …): one contiguous multiply by
    (a, b, a, b, …) then one pairwise add, ~30 % faster than multiplying the strided .real and .imag.
    `products` is a float32 buffer of `_dct_pack_rows`' shape."""
    a, b, src, _ = _dct_constants(n, kept)
    m = n // 2 + 1
    low = min(kept, m)
    d = spectrum.shape[-1]
    steps: list[Step] = [
        partial(np.multiply, spectrum[..., :low, :].view(np.float32), _dct_interleaved_weights(n, kept, d),
                out=products),
        partial(np.add, products[..., 0::2], products[..., 1::2], out=coef[..., :low, :])]
    if kept > m:  # keep > 1/2: bins above n/2 are mirrored conjugates

        def mirrored() -> None:
            sel = spectrum[..., src[m:], :]
            coef[..., m:, :] = sel.real * a[m:] + sel.imag * b[m:]

        steps.append(mirrored)
    return steps


def _dct_pack(spectrum: np.ndarray, n: int, kept: int, coef: np.ndarray, scratch: _Scratch) -> None:
    products = scratch.get("pack", _dct_pack_rows(spectrum, n, kept), np.float32)
    _run(_dct_pack_steps(spectrum, n, kept, coef, products))


_InverseConstants = tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@lru_cache(maxsize=256)
def _dct_inverse_constants(n: int, kept: int) -> _InverseConstants:
    """For the inverse: V_k = Y_k·e^{iθ_k}/2 − i·Y_{n−k}·e^{iθ_k}/2, Y_j = y_j / f_j, θ_k = πk/2n.

    Returns the weights on y_k for Re and Im of V_k (k < low), and the mirrored pairs (j = n − k kept)
    with their weights, all float32 columns."""
    _, _, _, f = _dct_constants(n, kept)
    m = n // 2 + 1
    low = min(kept, m)
    j = np.arange(kept)
    half_over_f = 1 / (2 * f)  # y_j → Y_j / 2
    theta = np.pi * j / (2 * n)
    re_w = _column((half_over_f * np.cos(theta))[:low])
    im_w = _column((half_over_f * np.sin(theta))[:low])
    mirrored = j[(j >= n - n // 2) & (j >= 1)]
    k = n - mirrored
    tk = np.pi * k / (2 * n)
    half = half_over_f[mirrored]
    return low, re_w, im_w, mirrored, k, _column(half * np.sin(tk)), _column(half * np.cos(tk))


@lru_cache(maxsize=256)
def _dct_unpack_weights(n: int, kept: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """The Re and Im weights on y_k (k < low) repeated along head_dim, [low, d] float32 C-contiguous.

    A (low, 1) column broadcast over a small head_dim makes numpy loop d values at a time (10× slower at
    d = 4); a full [low, d] block lets it run the kept bins and head_dim as one inner loop (same products)."""
    low, re_w, im_w, *_ = _dct_inverse_constants(n, kept)
    return (np.ascontiguousarray(np.broadcast_to(re_w, (low, d))),
            np.ascontiguousarray(np.broadcast_to(im_w, (low, d))))


def _dct_unpack_steps(coef: np.ndarray, n: int, spectrum: np.ndarray) -> list[Step]:
    low, _, _, mirrored, k, mir_re_w, mir_im_w = _dct_inverse_constants(n, coef.shape[-2])
    re_w, im_w = _dct_unpack_weights(n, coef.shape[-2], coef.shape[-1])
    re, im = spectrum.real, spectrum.imag
    steps: list[Step] = [
        partial(spectrum[..., low:, :].fill, 0),  # zero-fill only the dropped bins; the kept ones are assigned
        partial(np.multiply, coef[..., :low, :], re_w, out=re[..., :low, :]),
        partial(np.multiply, coef[..., :low, :], im_w, out=im[..., :low, :])]
    if mirrored.size:  # keep > 1/2: kept y_{n−k} also feeds bin k (< low, assigned just above)

        def mirror() -> None:
            re[..., k, :] += coef[..., mirrored, :] * mir_re_w
            im[..., k, :] -= coef[..., mirrored, :] * mir_im_w

        steps.append(mirror)
    return steps


def _dct_unpack(coef: np.ndarray, n: int, spectrum: np.ndarray) -> None:
    _run(_dct_unpack_steps(coef, n, spectrum))


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

    @cached_property  # (every call asks; a frozen dataclass may still cache in its __dict__)
    def payload_shape(self) -> tuple[int, ...]:
        return (*self.shape[:-2], self.kept_tokens, self.shape[-1])

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
    split = view.reshape((*view.shape[:-2], nb, n, view.shape[-1]))
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


def _groups(layout: BandKeepLayout) -> Iterator[tuple[int, int, int, int, int]]:
    """(first token, blocks, block length, kept per block, first payload token) of the full blocks, then the tail."""
    s, n, nb = layout.sinks, layout.block, layout.full_blocks
    if nb:
        yield s, nb, n, layout.kept_block, s
    if layout.tail:
        yield s + nb * n, 1, layout.tail, layout.kept_tail, s + nb * layout.kept_block


def _rows(a: np.ndarray) -> np.ndarray:
    """[..., T, D] → [rows, T, D] (a view for the C-contiguous arrays the codec sees; a copy otherwise)."""
    return a.reshape((math.prod(a.shape[:-2]), *a.shape[-2:]))


def encode(kv: np.ndarray, layout: BandKeepLayout, backend: FFTBackend,
           precision_bits: int | None = None, seed: int = 0) -> np.ndarray:
    """The payload [..., kept_tokens, D] in kv's dtype: sink tokens, then each block's kept coefficients."""
    src = _rows(kv)
    payload = np.empty(layout.payload_shape, kv.dtype)
    dst = _rows(payload)
    if layout.sinks:
        dst[:, : layout.sinks, :] = src[:, : layout.sinks, :]
    rng = np.random.default_rng(seed) if precision_bits else None
    plan = _plan_for(layout, kv.dtype, CHUNK_BYTES) if SMALL_FAST_PATH else None
    scratch = _borrow()
    try:
        if plan is None:
            _encode_groups(src, dst, layout, backend, rng, precision_bits, scratch)
        else:
            _encode_planned(src, dst, plan, backend, rng, precision_bits, scratch)
    finally:
        _idle_scratch.append(scratch)
    return payload


def _encode_groups(src: np.ndarray, dst: np.ndarray, layout: BandKeepLayout, backend: FFTBackend,
                   rng: np.random.Generator | None, precision_bits: int | None, scratch: _Scratch) -> None:
    """Every block's kept coefficients from src [rows, tokens, D] into dst [rows, kept_tokens, D], by chunks."""
    rows, d = src.shape[0], src.shape[-1]
    for start, count, length, kept, pos in _groups(layout):
        blocks = _split_tokens(src[:, start : start + count * length, :], count, length)
        coefs = _split_tokens(dst[:, pos : pos + count * kept, :], count, kept)
        for rs, bs in _chunks(rows, count, length * d * 4):
            out = coefs[rs, bs]
            # float32 payloads take the coefficients directly; others round from a float32 scratch.
            coef = out if out.dtype == np.float32 else scratch.get("coef", out.shape, np.float32)
            _forward_into(blocks[rs, bs], layout.variant, kept, backend, coef, scratch)
            if rng is not None and precision_bits is not None:  # (rng is made only with precision_bits)
                _add_precision_noise(coef, precision_bits, rng)
            if coef is not out:
                store(out, coef, scratch)


def decode(payload: np.ndarray, layout: BandKeepLayout, backend: FFTBackend) -> np.ndarray:
    """Rebuild [..., tokens, D] in the payload's dtype from the sinks and the kept coefficients."""
    out = np.empty(layout.shape, payload.dtype)
    src, dst = _rows(payload), _rows(out)
    plan = _plan_for(layout, payload.dtype, CHUNK_BYTES) if SMALL_FAST_PATH else None
    scratch = _borrow()
    try:
        if plan is None:
            if layout.sinks:
                dst[:, : layout.sinks, :] = src[:, : layout.sinks, :]
            _decode_groups(src, dst, layout, backend, scratch)
        else:
            _decode_planned(src, dst, plan, backend, scratch)  # (writes the sinks itself)
    finally:
        _idle_scratch.append(scratch)
    return out


def _decode_groups(src: np.ndarray, dst: np.ndarray, layout: BandKeepLayout, backend: FFTBackend,
                   scratch: _Scratch) -> None:
    """Every block rebuilt from src [rows, kept_tokens, D] into dst [rows, tokens, D], by chunks."""
    rows, d = src.shape[0], src.shape[-1]
    for start, count, length, kept, pos in _groups(layout):
        coefs = _split_tokens(src[:, pos : pos + count * kept, :], count, kept)
        blocks = _split_tokens(dst[:, start : start + count * length, :], count, length)
        for rs, bs in _chunks(rows, count, length * d * 4):
            coef, dest = coefs[rs, bs], blocks[rs, bs]
            v = scratch.get("inverse", dest.shape, np.float32)
            _inverse_into(coef, layout.variant, length, backend, v, scratch)
            if layout.variant == "dct":
                x = dest if dest.dtype == np.float32 else scratch.get("unreordered", dest.shape, np.float32)
                _reorder_back_into(v, x)
            else:
                x = v
            if x is not dest:
                store(dest, x, scratch)


# --- Small arrays: a plan per layout, its views per scratch set -------------------------------------------
#
# A one-channel layer (llama3-8b at scale 1/1024: [2, 2048, 1] BF16, 8 KB) is far below one chunk, and on it
# the chunked path's per-call Python work (layout arithmetic, ~10 named scratch lookups, the views of two
# groups, their packs' views) cost ~20× the FFT itself (r2c was ~5 % of such a call; benchmarks/RESULTS.md,
# "Band-keep on small chunks").
# An array the chunked path would take in one chunk per group (one FFT call per group) runs instead on a
# plan made once per (layout, dtype): the token order that stages every group's DCT reorder in one gather,
# and, per scratch set, the views of that plan over its buffers with each group's pack or unpack bound to
# them (`Step`s). Same ufuncs on the same values as the chunked path, so the same bits
# (tests/unit/test_bandkeep_small_chunks.py pins them). The coefficients of all groups sit in one float32
# buffer laid out as the payload's body, so bfloat16 rounding is one pass for the whole array, not one per group.

SMALL_FAST_PATH = True  # False: every array takes the chunked path (the reference the tests compare with)


def _dct_order(n: int) -> np.ndarray:
    """The DCT's reorder of a block as a gather: v = x[order], [0, 2, 4, …, 5, 3, 1]."""
    return np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)[::-1]])


class _Plan:
    """What a layout and dtype fix for every small call (immutable, shared by threads)."""

    def __init__(self, layout: BandKeepLayout, dtype: np.dtype, rows: int) -> None:
        self.layout, self.dtype, self.rows = layout, dtype, rows
        # bfloat16 is moved as its uint16 bits (widened by a shift, rounded by integer ops).
        self.storage = np.dtype(np.uint16) if dtype == BF16 else dtype
        self.groups = tuple(_groups(layout))
        s, tokens = layout.sinks, layout.tokens
        self.stage_order: np.ndarray | None = None  # staged[:, j] = x[:, stage_order[j]] (j over the body)
        self.unstage_order: np.ndarray | None = None  # out[:, t] = arena[:, unstage_order[t]] (sinks: themselves)
        if layout.variant == "dct":
            order = np.concatenate([(start + length * np.arange(count)[:, None] + _dct_order(length)).ravel()
                                    for start, count, length, _, _ in self.groups] or [np.arange(0)])
            inverse = np.empty(tokens - s, np.intp)
            inverse[order - s] = np.arange(s, tokens)
            self.stage_order = order.astype(np.intp)
            self.unstage_order = np.concatenate([np.arange(s, dtype=np.intp), inverse])
            self.stage_order.flags.writeable = self.unstage_order.flags.writeable = False  # shared by threads


@lru_cache(maxsize=256)
def _plan_for(layout: BandKeepLayout, dtype: np.dtype, chunk_bytes: int) -> _Plan | None:
    """A plan when every group fits one chunk of `chunk_bytes` (as `_chunks` cuts them), else None."""
    rows, d = math.prod(layout.shape[:-2]), layout.shape[-1]
    if rows == 0 or d == 0:
        return None
    for _, count, length, _, _ in _groups(layout):
        if max(1, chunk_bytes // (length * d * 4)) < rows * count:
            return None
    return _Plan(layout, dtype, rows)


class _EncodeViews:
    """One plan's encode buffers in one scratch set: the staged body, each group's FFT input, spectrum and
    pack steps, and the coefficients of all groups in the payload body's layout [rows, kept_tokens − sinks, D]."""

    def __init__(self, plan: _Plan, scratch: _Scratch) -> None:
        lay, rows, d = plan.layout, plan.rows, plan.layout.shape[-1]
        s, body, kept_body = lay.sinks, lay.tokens - lay.sinks, lay.kept_tokens - lay.sinks
        self.plan = plan
        self.staged = scratch.get("plan-staged", (rows, body, d), np.float32)
        # A gather in the input's own element type, then one widening pass (float32 gathers into `staged`).
        self.gathered = (None if plan.stage_order is None or plan.dtype == np.float32
                         else scratch.get("plan-gathered", (rows, body, d), plan.storage))
        self.coef = scratch.get("plan-coef", (rows, kept_body, d), np.float32)
        self.rounded = scratch.get("plan-round", (rows, kept_body, d), np.uint32) if plan.dtype == BF16 else None
        # Groups run one after the other: they share one spectrum and one products buffer.
        spectra = [(rows, count, length // 2 + 1, d) for _, count, length, _, _ in plan.groups]
        spectrum_buf = scratch.get("plan-spectrum", (max(map(math.prod, spectra), default=0),), np.complex64)
        self.groups: list[tuple[np.ndarray, np.ndarray, np.ndarray, list[Step]]] = []
        for (start, count, length, kept, pos), shape in zip(plan.groups, spectra, strict=True):
            x = _split_tokens(self.staged[:, start - s : start - s + count * length, :], count, length)
            coef = _split_tokens(self.coef[:, pos - s : pos - s + count * kept, :], count, kept)
            spectrum = spectrum_buf[: math.prod(shape)].reshape(shape)
            if lay.variant == "dct":
                rows_shape = _dct_pack_rows(spectrum, length, kept)
                products = scratch.get("plan-pack", (math.prod(rows_shape),), np.float32).reshape(rows_shape)
                steps = _dct_pack_steps(spectrum, length, kept, coef, products)
            else:
                steps = _fourier_pack_steps(spectrum, length, kept, coef)
            self.groups.append((x, spectrum, coef, steps))

    def stage(self, src: np.ndarray) -> None:
        """staged = the body of src [rows, tokens, D] as float32, each block in its transform's order."""
        plan, s = self.plan, self.plan.layout.sinks
        bits = src.view(plan.storage)
        if plan.stage_order is None:  # fft: a widening copy
            if plan.dtype == BF16:
                np.left_shift(bits[:, s:, :], 16, out=self.staged.view(np.uint32), dtype=np.uint32)
            else:
                np.copyto(self.staged, src[:, s:, :])
            return
        # mode="wrap": the indices are in range, and only the default "raise" mode buffers the output.
        if self.gathered is None:
            src.take(plan.stage_order, axis=1, out=self.staged, mode="wrap")
            return
        bits.take(plan.stage_order, axis=1, out=self.gathered, mode="wrap")
        if plan.dtype == BF16:  # bfloat16 is the high half of a float32
            np.left_shift(self.gathered, 16, out=self.staged.view(np.uint32), dtype=np.uint32)
        else:
            np.copyto(self.staged, self.gathered)

    def store(self, dest_body: np.ndarray) -> None:
        """The payload's body (all kept coefficients) = coef in the payload's dtype, bfloat16 rounded once."""
        if self.rounded is not None:
            _round_bf16(self.coef.view(np.uint32), self.rounded, dest_body.view(np.uint16))
        else:
            np.copyto(dest_body, self.coef)


def _encode_planned(src: np.ndarray, dst: np.ndarray, plan: _Plan, backend: FFTBackend,
                    rng: np.random.Generator | None, precision_bits: int | None, scratch: _Scratch) -> None:
    """`_encode_groups` for a planned array (src [rows, tokens, D] → dst [rows, kept_tokens, D]; sinks done)."""
    views = scratch.planned((plan, "encode"), partial(_EncodeViews, plan))
    views.stage(src)
    for x, spectrum, coef, pack in views.groups:
        backend.rfft_into(x, spectrum, axis=-2)
        _run(pack)
        if rng is not None and precision_bits is not None:
            _add_precision_noise(coef, precision_bits, rng)
    views.store(dst[:, plan.layout.sinks :, :])


class _DecodeViews:
    """One plan's decode buffers in one scratch set: the coefficients widened, each group's spectrum, unpack
    steps and inverse, into one signal [rows, tokens, D] whose first `sinks` tokens hold the sinks for the
    final un-reorder (one gather of every token)."""

    def __init__(self, plan: _Plan, scratch: _Scratch) -> None:
        lay, rows, d = plan.layout, plan.rows, plan.layout.shape[-1]
        s, kept_body = lay.sinks, lay.kept_tokens - lay.sinks
        self.plan = plan
        self.coef = scratch.get("plan-coef-in", (rows, kept_body, d), np.float32)
        self.signal = scratch.get("plan-inverse", (rows, lay.tokens, d), np.float32)
        # The output's elements before the un-reorder (dct only; a float32 output un-reorders `signal` itself).
        self.arena = (None if plan.unstage_order is None else self.signal if plan.dtype == np.float32
                      else scratch.get("plan-out", (rows, lay.tokens, d), plan.storage))
        self.rounded = (scratch.get("plan-round", (rows, lay.tokens - s, d), np.uint32)
                        if plan.dtype == BF16 else None)
        spectra = [(rows, count, length // 2 + 1, d) for _, count, length, _, _ in plan.groups]
        spectrum_buf = scratch.get("plan-spectrum", (max(map(math.prod, spectra), default=0),), np.complex64)
        self.groups: list[tuple[np.ndarray, np.ndarray, int, list[Step]]] = []
        for (start, count, length, kept, pos), shape in zip(plan.groups, spectra, strict=True):
            coef = _split_tokens(self.coef[:, pos - s : pos - s + count * kept, :], count, kept)
            v = _split_tokens(self.signal[:, start : start + count * length, :], count, length)
            spectrum = spectrum_buf[: math.prod(shape)].reshape(shape)
            steps = (_dct_unpack_steps if lay.variant == "dct" else _fourier_unpack_steps)(coef, length, spectrum)
            self.groups.append((spectrum, v, length, steps))

    def widen(self, src_body: np.ndarray) -> None:
        """coef = the payload's body (every kept coefficient) as float32."""
        if self.plan.dtype == BF16:  # by integer shift, not ml_dtypes' slow cast
            np.left_shift(src_body.view(np.uint16), 16, out=self.coef.view(np.uint32), dtype=np.uint32)
        else:
            np.copyto(self.coef, src_body)

    def store(self, src: np.ndarray, dst: np.ndarray) -> None:
        """dst [rows, tokens, D] = the payload's sinks, then the signal's body in dst's dtype, in token order."""
        plan, s = self.plan, self.plan.layout.sinks
        src, dst = src.view(plan.storage), dst.view(plan.storage)
        arena = dst if self.arena is None else self.arena
        body, target = self.signal[:, s:, :], arena[:, s:, :]
        if self.rounded is not None:
            _round_bf16(body.view(np.uint32), self.rounded, target)
        elif target is not body and arena is not self.signal:
            np.copyto(target, body)  # float16 rounds here, float32 copies
        if s:
            arena[:, :s, :] = src[:, :s, :]
        if plan.unstage_order is not None:
            arena.take(plan.unstage_order, axis=1, out=dst, mode="wrap")


def _decode_planned(src: np.ndarray, dst: np.ndarray, plan: _Plan, backend: FFTBackend, scratch: _Scratch) -> None:
    """`_decode_groups` for a planned array, sinks included (src [rows, kept_tokens, D] → dst [rows, tokens, D])."""
    views = scratch.planned((plan, "decode"), partial(_DecodeViews, plan))
    views.widen(src[:, plan.layout.sinks :, :])
    for spectrum, v, length, unpack in views.groups:
        _run(unpack)
        backend.irfft_into(spectrum, v, length, axis=-2)
    views.store(src, dst)
