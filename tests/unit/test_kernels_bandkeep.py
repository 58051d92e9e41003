"""Band-keep: transform correctness, round trips, the Gaussian sanity check, backends, ragged tails, sinks."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import scipy.fft

from kvtransit.kernels import bandkeep, get_codec
from kvtransit.kernels.fft_backends import available_backends, get_backend

DTYPES = {"float32": (np.float32, 1e-5), "float16": (np.float16, 2e-3), "bfloat16": (ml_dtypes.bfloat16, 8e-3)}


def _kv(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _rel(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("n", [2, 3, 8, 17, 64])
def test_dct_from_fft_equals_scipy_orthonormal_dct(n):
    x = _kv((5, n, 7))
    coef = bandkeep.forward_blocks(x, "dct", n, get_backend("scipy"))
    np.testing.assert_allclose(coef, scipy.fft.dct(x, axis=-2, norm="ortho"), atol=2e-6)


@pytest.mark.parametrize("variant", bandkeep.VARIANTS)
@pytest.mark.parametrize("n", [4, 7, 16])
def test_every_kept_count_is_an_orthonormal_projection(variant, n):
    """Error energy = total − kept energy, for every k: the transform is orthonormal at every cut."""
    x = _kv((3, n, 5))
    be = get_backend("scipy")
    for kept in range(1, n + 1):
        coef = bandkeep.forward_blocks(x, variant, kept, be)
        back = bandkeep.inverse_blocks(coef, variant, n, be)
        if variant == "dct":
            back = bandkeep.reorder_back(back)
        err = float(((back - x) ** 2).sum())
        assert err == pytest.approx(float((x**2).sum() - (coef**2).sum()), abs=1e-3)


@pytest.mark.parametrize("variant", bandkeep.VARIANTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_keep_one_round_trips_to_dtype_tolerance(variant, dtype):
    np_dtype, tol = DTYPES[dtype]
    kv = _kv((2, 2, 3, 150, 16), np_dtype)  # 5-D layout, sinks 4, ragged tail of 146 % 64 = 18
    codec = get_codec("freq-keep-k", keep=1.0, block=64, variant=variant)
    enc = codec.encode(kv)
    out = codec.decode(enc.header, enc.payload.tobytes())
    assert out.dtype == kv.dtype and out.shape == kv.shape
    assert _rel(out, kv) < tol


@pytest.mark.parametrize("variant", bandkeep.VARIANTS)
@pytest.mark.parametrize("keep", [0.25, 0.5, 0.75])
def test_gaussian_relative_error_is_sqrt_of_dropped_fraction(variant, keep):
    kv = _kv((4, 2048, 64), seed=1)
    codec = get_codec("freq-keep-k", keep=keep, block=64, sinks=0, variant=variant)
    enc = codec.encode(kv)
    err = _rel(codec.decode(enc.header, enc.payload), kv)
    assert err == pytest.approx(math.sqrt(1 - keep), rel=0.01)


def test_keep_half_keeps_n_over_2_reals_not_n_over_2_complex_bins():
    kv = _kv((1, 4 + 128, 8))
    enc = get_codec("freq-keep-k", keep=0.5, block=64, sinks=4, variant="fft").encode(kv)
    assert enc.payload.shape == (1, 4 + 2 * 32, 8)
    assert enc.payload.nbytes == (4 + 64) * 8 * 4


@pytest.mark.parametrize("variant", bandkeep.VARIANTS)
def test_sinks_travel_exact_and_the_ragged_tail_gets_its_own_transform(variant):
    kv = _kv((3, 4 + 64 + 10, 8), np.float32)  # one full block, a ragged tail of 10
    codec = get_codec("freq-keep-k", keep=0.5, block=64, sinks=4, variant=variant)
    enc = codec.encode(kv)
    assert enc.payload.shape[-2] == 4 + 32 + 5
    out = codec.decode(enc.header, enc.payload)
    np.testing.assert_array_equal(out[:, :4], kv[:, :4])
    # The tail is low-passed on its own: its mean (coefficient 0) survives exactly.
    np.testing.assert_allclose(out[:, -10:].mean(axis=1), kv[:, -10:].mean(axis=1), atol=1e-5)


def test_a_tail_of_one_token_round_trips_exactly():
    kv = _kv((2, 4 + 64 + 1, 8))
    codec = get_codec("freq-keep-k", keep=0.5, block=64, sinks=4)
    enc = codec.encode(kv)
    np.testing.assert_allclose(codec.decode(enc.header, enc.payload)[:, -1], kv[:, -1], atol=1e-6)


def test_sinks_equal_to_the_sequence_send_everything_exact():
    kv = _kv((2, 4, 8))
    codec = get_codec("freq-keep-k", keep=0.5, sinks=4)
    enc = codec.encode(kv)
    np.testing.assert_array_equal(codec.decode(enc.header, enc.payload), kv)


@pytest.mark.parametrize("variant", bandkeep.VARIANTS)
def test_every_backend_gives_the_same_numbers(variant):
    kv = _kv((2, 3, 4 + 200, 16))
    names = available_backends()
    assert "scipy" in names and "numpy" in names
    ref_codec = get_codec("freq-keep-k", keep=0.5, block=32, variant=variant, backend="numpy")
    ref = ref_codec.encode(kv)
    ref_out = ref_codec.decode(ref.header, ref.payload)
    for name in names:
        codec = get_codec("freq-keep-k", keep=0.5, block=32, variant=variant, backend=name)
        enc = codec.encode(kv)
        np.testing.assert_allclose(enc.payload, ref.payload, atol=2e-5)
        np.testing.assert_allclose(codec.decode(enc.header, enc.payload), ref_out, atol=2e-5)


def test_auto_backend_picks_the_first_importable_in_measured_order():
    from kvtransit.kernels.fft_backends import AUTO_PREFERENCE

    assert get_backend("auto").name == available_backends()[0] == AUTO_PREFERENCE[0]


def test_precision_noise_matches_the_enob_formula_and_is_seeded():
    kv = _kv((8, 4096, 16), seed=2)
    clean = get_codec("freq-keep-k", keep=1.0, sinks=0, block=64)
    noisy = get_codec("freq-keep-k", keep=1.0, sinks=0, block=64, precision_bits=8, seed=3)
    c = clean.encode(kv).payload.astype(np.float64)
    n1 = noisy.encode(kv).payload.astype(np.float64)
    np.testing.assert_array_equal(n1, noisy.encode(kv).payload)  # same seed, same noise
    # Uniform noise of a b-bit quantiser over ±FS: RMS = FS / (2^b·√3), FS = each block's max |coef|.
    blocks = c.reshape(8, 64, 64, 16)
    fs = np.abs(blocks).max(axis=(-2, -1), keepdims=True)
    expected_rms = float(np.sqrt(np.mean((fs / (2**8 * math.sqrt(3))) ** 2)))
    measured_rms = float(np.sqrt(np.mean((n1 - c) ** 2)))
    assert measured_rms == pytest.approx(expected_rms, rel=0.05)


def _dct_oracle_payload(kv, block, sinks, keep):
    """Sinks, then each block's first kept orthonormal DCT-II coefficients (scipy.fft.dct as the oracle)."""
    x = kv.astype(np.float32)
    body = x[..., sinks:, :]
    blocks = body.reshape((*body.shape[:-2], body.shape[-2] // block, block, body.shape[-1]))
    kept = bandkeep.kept_count(block, keep)
    coef = scipy.fft.dct(blocks.astype(np.float64), axis=-2, norm="ortho")[..., :kept, :]
    coef = coef.reshape((*x.shape[:-2], -1, x.shape[-1]))
    return np.concatenate([x[..., :sinks, :], coef], axis=-2)


@pytest.mark.parametrize("chunk_bytes", [1, 3 * 64 * 8 * 4, 1 << 30])
@pytest.mark.parametrize("keep", [0.5, 0.75])
def test_dct_payload_equals_scipy_dct_however_the_blocks_are_chunked(monkeypatch, chunk_bytes, keep):
    """Chunks of one block, of 3 blocks (splitting rows), and of everything give the oracle's numbers."""
    monkeypatch.setattr(bandkeep, "CHUNK_BYTES", chunk_bytes)
    kv = _kv((2, 3, 4 + 5 * 64, 8), seed=4)
    enc = get_codec("freq-keep-k", keep=keep, block=64, sinks=4, variant="dct", backend="scipy").encode(kv)
    np.testing.assert_allclose(enc.payload, _dct_oracle_payload(kv, 64, 4, keep), atol=2e-6)


@pytest.mark.parametrize("variant", bandkeep.VARIANTS)
def test_bfloat16_input_gives_the_float32_coefficients_rounded_once(variant):
    """The fused bfloat16 widening is exact: bf16 in → the float32 path's coefficients, rounded to bf16."""
    kv16 = _kv((2, 4, 4 + 3 * 64 + 9, 16), ml_dtypes.bfloat16, seed=5)
    codec = get_codec("freq-keep-k", keep=0.5, block=64, sinks=4, variant=variant, backend="scipy")
    from_bf16 = codec.encode(kv16).payload
    from_f32 = codec.encode(kv16.astype(np.float32)).payload
    assert from_bf16.dtype == kv16.dtype
    np.testing.assert_array_equal(from_bf16.view(np.uint16), from_f32.astype(ml_dtypes.bfloat16).view(np.uint16))
    # Decoding widens bf16 coefficients exactly too: the bf16 decode is the float32 decode of the same
    # (bf16-valued) coefficients, rounded once.
    back = codec.decode(codec.encode(kv16).header, from_bf16)
    ref = codec.decode(codec.encode(kv16.astype(np.float32)).header, from_bf16.astype(np.float32))
    np.testing.assert_array_equal(back.view(np.uint16), ref.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_concurrent_encodes_in_threads_do_not_share_scratch_buffers():
    """The middlebox encodes in executor threads; each thread's staging buffers are its own."""
    from concurrent.futures import ThreadPoolExecutor

    inputs = [_kv((2, 8, 4 + 4 * 64, 32), ml_dtypes.bfloat16, seed=s) for s in range(6)]
    codec = get_codec("freq-keep-k", keep=0.5, block=64, sinks=4, variant="dct")
    serial = [codec.encode(kv).payload for kv in inputs]
    with ThreadPoolExecutor(max_workers=3) as pool:
        threaded = list(pool.map(lambda kv: codec.encode(kv).payload, inputs * 3))
    for i, payload in enumerate(threaded):
        np.testing.assert_array_equal(payload.view(np.uint16), serial[i % len(inputs)].view(np.uint16))
