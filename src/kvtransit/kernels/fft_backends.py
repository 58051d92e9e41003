"""Real FFT backends chosen by name: `scipy`, `pyfftw`, `numpy`, and `auto`.

Every backend computes the same unnormalised real FFT (numpy's convention: forward sums, inverse divides
by n) along one axis, in float32 for float32 input, on one core (`workers=1` / `threads=1`): the module
runs one stream per pluggable, and a per-core figure is the honest one to compare with a line rate.

`auto` takes the first importable backend in `AUTO_PREFERENCE`, an order measured (not timed at import:
the kernels hold no clock) by `benchmarks/kernels.py` on the reference 2-core box, float32, 64-token
blocks, forward band-keep (fft variant), one core: scipy 1.10 GB/s, pyfftw 0.74, numpy 0.43 (bare
scipy rFFT 1.76 in the same run; benchmarks/RESULTS.md, "## Kernels"). scipy also led at N = 8 and 1024.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtransit.model.errors import unknown_name

from .errors import KernelInputError

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


class ScipyBackend(FFTBackend):
    name = "scipy"

    def __init__(self) -> None:
        import scipy.fft

        self._fft = scipy.fft

    def rfft(self, x: np.ndarray, axis: int) -> np.ndarray:
        return self._fft.rfft(x, axis=axis, workers=1)

    def irfft(self, spectrum: np.ndarray, n: int, axis: int) -> np.ndarray:
        # overwrite_x: the spectrum is a scratch buffer band-keep built for this call.
        return self._fft.irfft(spectrum, n=n, axis=axis, workers=1, overwrite_x=True)


class NumpyBackend(FFTBackend):
    name = "numpy"

    def rfft(self, x: np.ndarray, axis: int) -> np.ndarray:
        return np.fft.rfft(x, axis=axis)

    def irfft(self, spectrum: np.ndarray, n: int, axis: int) -> np.ndarray:
        return np.fft.irfft(spectrum, n=n, axis=axis)


@dataclass
class PyFFTWBackend(FFTBackend):
    """FFTW plans made once per (kind, shape, dtype, axis, n) and reused.

    A cached `pyfftw.FFTW` object owns its input and output buffers, so the result is copied out before
    it is returned; the cache is not meant to be shared by concurrent threads (use one backend per thread).
    """

    name: str = "pyfftw"
    planner_effort: str = "FFTW_MEASURE"  # planning happens once per shape; MEASURE plans run faster
    _plans: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        import pyfftw.builders

        self._builders = pyfftw.builders

    def _plan(self, kind: str, x: np.ndarray, axis: int, n: int | None):
        key = (kind, x.shape, x.dtype.str, axis, n)
        plan = self._plans.get(key)
        if plan is None:
            build = self._builders.rfft if kind == "r" else self._builders.irfft
            plan = build(x, n=n, axis=axis, threads=1, planner_effort=self.planner_effort,
                         overwrite_input=kind == "i", auto_align_input=True)
            self._plans[key] = plan
        return plan

    def rfft(self, x: np.ndarray, axis: int) -> np.ndarray:
        return self._plan("r", x, axis, None)(x).copy()

    def irfft(self, spectrum: np.ndarray, n: int, axis: int) -> np.ndarray:
        return self._plan("i", spectrum, axis, n)(spectrum).copy()


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
