"""The FFT backends leave their callers' arrays alone (kernels/fft_backends.py): band-keep reuses its staging
buffers across calls, so a backend that wrote into one would corrupt every later encode from it."""

from __future__ import annotations

import numpy as np
import pytest

from kvtransit.kernels.fft_backends import available_backends, get_backend


def _at(offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of `shape` whose data starts `offset` elements past a 64-byte boundary."""
    size = int(np.prod(shape))
    raw = np.zeros(size + 16 + 64 // 4, np.float32)
    start = (-raw.ctypes.data % 64) // 4 + offset
    return raw[start:start + size].reshape(shape)


@pytest.mark.parametrize("offset", [0, 1, 4])  # SIMD-aligned (the case that was adopted), and not
@pytest.mark.parametrize("name", available_backends())
def test_a_backend_never_writes_into_an_array_it_was_given(name, offset):
    backend = type(get_backend(name))()  # a fresh plan cache, not the shared instance
    rng = np.random.default_rng(0)
    first = _at(offset, (4, 64))
    first[...] = rng.standard_normal((4, 64))
    kept = first.copy()
    second = _at(offset + 3, (4, 64))
    second[...] = rng.standard_normal((4, 64))
    spectrum = backend.rfft(first, 1)
    backend.rfft(second, 1)  # same shape, other alignment: pyFFTW once copied this into `first`
    assert np.array_equal(first, kept)
    np.testing.assert_allclose(spectrum, np.fft.rfft(kept, axis=1), rtol=1e-4, atol=1e-4)
    coefficients = np.fft.rfft(kept, axis=1).astype(np.complex64)
    before = coefficients.copy()
    signal = backend.irfft(coefficients, 64, 1)  # a c2r may destroy its input: never the caller's
    assert np.array_equal(coefficients, before)
    np.testing.assert_allclose(signal, kept, rtol=1e-4, atol=1e-4)
