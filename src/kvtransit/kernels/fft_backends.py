"""Real FFT backends chosen by name: `scipy`, `pyfftw`, `numpy`, and `auto`.

Every backend computes the same unnormalised real FFT (numpy's convention: forward sums, inverse divides
by n) along one axis, in float32 for float32 input, on one core (`workers=1` / `threads=1`): the module
runs one stream per pluggable, and a per-core figure is the honest one to compare with a line rate.

`auto` takes the first importable backend in `AUTO_PREFERENCE`, an order measured (not timed at import:
the kernels hold no clock) by `benchmarks/kernels.py` on the reference 2-core box, float32, 64-token
blocks, forward band-keep (fft variant), one core: scipy 1.47 GB/s, pyfftw 1.10, numpy 0.66 (bare
scipy rFFT 1.63 in the same runs; benchmarks/RESULTS.md, "## Kernels"; dct variant 1.23 / 1.17 / 0.62).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtransit.kernels.errors import KernelInputError
from kvtransit.model.errors import unknown_name

# Measured preference order (benchmarks/RESULTS.md "## Kernels"; see the module docstring).
AUTO_PREFERENCE: tuple[str, ...] = ("scipy", "pyfftw", "numpy")
BACKEND_NAMES: tuple[str, ...] = ("auto", *AUTO_PREFERENCE)


class FFTBackend:
    """One FFT library behind the two calls band-keep needs."""

    name: str

    def rfft(self, x: np.ndarray, axis: int) -> np.ndarray:
        raise NotImplementedError

    def irfft(self, spectrum: np.ndarray, n: int, axis: int) -> np.ndarray:
        raise NotImplementedError

    def rfft_into(self, x: np.ndarray, out: np.ndarray, axis: int) -> None:
        """out[...] = rfft(x) (complex64). Backends that can write in place override this: band-keep
        calls it on cache-sized chunks with a reused `out`, so a fresh result array would cost its
        allocation (and, for large ones, the page faults) on every chunk."""
        out[...] = self.rfft(x, axis)

    def irfft_into(self, spectrum: np.ndarray, out: np.ndarray, n: int, axis: int) -> None:
        """out[...] = irfft(spectrum, n) (float32); `spectrum` may be overwritten."""
        out[...] = self.irfft(spectrum, n, axis)


class ScipyBackend(FFTBackend):
    name = "scipy"

    def __init__(self) -> None:
        import scipy.fft

        self._fft = scipy.fft
        # scipy.fft's own pocketfft binding takes an `out` array; the public scipy.fft.rfft does not.
        # It is private API, so it is optional: without it, the base class's copying fallback runs.
        try:
            from scipy.fft._pocketfft import pypocketfft
        except ImportError:
            pypocketfft = None
        self._pocketfft = pypocketfft

    def rfft(self, x: np.ndarray, axis: int) -> np.ndarray:
        return self._fft.rfft(x, axis=axis, workers=1)

    def irfft(self, spectrum: np.ndarray, n: int, axis: int) -> np.ndarray:
        # overwrite_x: the spectrum is a scratch buffer band-keep built for this call.
        return self._fft.irfft(spectrum, n=n, axis=axis, workers=1, overwrite_x=True)

    def rfft_into(self, x: np.ndarray, out: np.ndarray, axis: int) -> None:
        if self._pocketfft is None:
            return super().rfft_into(x, out, axis)
        # inorm=0: unnormalised forward, numpy's convention; nthreads=1: one core (module docstring).
        self._pocketfft.r2c(x, (axis % x.ndim,), True, 0, out, 1)

    def irfft_into(self, spectrum: np.ndarray, out: np.ndarray, n: int, axis: int) -> None:
        if self._pocketfft is None:
            return super().irfft_into(spectrum, out, n, axis)
        # inorm=2: divide by n, numpy's inverse convention.
        self._pocketfft.c2r(spectrum, (axis % spectrum.ndim,), n, False, 2, out, 1)


class NumpyBackend(FFTBackend):
    name = "numpy"

    def rfft(self, x: np.ndarray, axis: int) -> np.ndarray:
        return np.fft.rfft(x, axis=axis)

    def irfft(self, spectrum: np.ndarray, n: int, axis: int) -> np.ndarray:
        return np.fft.irfft(spectrum, n=n, axis=axis)

    # np.fft takes `out` since numpy 2.0 (pyproject allows 1.26: there, the copying fallback runs).
    _has_out = np.lib.NumpyVersion(np.__version__) >= "2.0.0"

    def rfft_into(self, x: np.ndarray, out: np.ndarray, axis: int) -> None:
        if not self._has_out:
            return super().rfft_into(x, out, axis)
        np.fft.rfft(x, axis=axis, out=out)

    def irfft_into(self, spectrum: np.ndarray, out: np.ndarray, n: int, axis: int) -> None:
        if not self._has_out:
            return super().irfft_into(spectrum, out, n, axis)
        np.fft.irfft(spectrum, n=n, axis=axis, out=out)


@dataclass
class PyFFTWBackend(FFTBackend):
    """FFTW plans made once per (kind, shape, dtype, axis, n) and reused.

    A cached `pyfftw.FFTW` object owns its input and output buffers: the caller's array is copied into the plan's
    input and the result copied out. (Calling the plan with the caller's array instead lets pyFFTW adopt that
    array as its input when it happens to fit, and copy a later, differently aligned input *into* it: band-keep's
    reused staging buffer was overwritten so, and every later encode from it came out wrong.) The cache is not
    meant to be shared by concurrent threads (use one backend per thread).
    """

    name: str = "pyfftw"
    planner_effort: str = "FFTW_MEASURE"  # planning happens once per shape; MEASURE plans run faster
    _plans: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        import pyfftw.builders

        self._builders = pyfftw.builders
        self._empty_aligned = pyfftw.empty_aligned

    def _plan(self, kind: str, x: np.ndarray, axis: int, n: int | None) -> Any:
        """pyFFTW's builder object for this shape (untyped: pyFFTW ships no annotations)."""
        key = (kind, x.shape, x.dtype.str, axis, n)
        plan = self._plans.get(key)
        if plan is None:
            build = self._builders.rfft if kind == "r" else self._builders.irfft
            # Planned on an array of its own: planned on `x`, an aligned `x` became the plan's input buffer.
            own = self._empty_aligned(x.shape, x.dtype)
            plan = build(own, n=n, axis=axis, threads=1, planner_effort=self.planner_effort,
                         overwrite_input=kind == "i", auto_align_input=True)
            self._plans[key] = plan
        return plan

    def _run(self, plan: Any, x: np.ndarray) -> np.ndarray:
        plan.input_array[...] = x  # into the plan's own buffer, never the caller's adopted (class docstring)
        out: np.ndarray = plan().copy()
        return out

    def rfft(self, x: np.ndarray, axis: int) -> np.ndarray:
        return self._run(self._plan("r", x, axis, None), x)

    def irfft(self, spectrum: np.ndarray, n: int, axis: int) -> np.ndarray:
        return self._run(self._plan("i", spectrum, axis, n), spectrum)


_CONSTRUCTORS = {"scipy": ScipyBackend, "pyfftw": PyFFTWBackend, "numpy": NumpyBackend}
_instances: dict[str, FFTBackend] = {}


def available_backends() -> tuple[str, ...]:
    """Backends importable here, in preference order."""
    found = []
    for name in AUTO_PREFERENCE:
        try:
            get_backend(name)
        except KernelInputError:
            continue
        found.append(name)
    return tuple(found)


def get_backend(name: str = "auto") -> FFTBackend:
    """The backend called `name`; `auto` falls back along `AUTO_PREFERENCE` to the first importable one."""
    if name == "auto":
        for candidate in AUTO_PREFERENCE:
            try:
                return get_backend(candidate)
            except KernelInputError:
                continue
        raise KernelInputError(f"no FFT backend importable (tried: {', '.join(AUTO_PREFERENCE)})")
    if name not in _CONSTRUCTORS:
        raise KernelInputError(str(unknown_name("FFT backend", name, BACKEND_NAMES)))
    backend = _instances.get(name)
    if backend is None:
        try:
            backend = _CONSTRUCTORS[name]()
        except ImportError as exc:
            raise KernelInputError(f"FFT backend {name!r} is not importable here: {exc}") from exc
        _instances[name] = backend
    return backend
