"""The codec registry the middlebox calls: header, payload, requantisers, declarations, bad input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kvtransit.kernels import CODEC_NAMES, Encoded, KernelInputError, decode, get_codec
from kvtransit.kernels.header import MAX_HEADER_BYTES, Header
from kvtransit.kernels.page_scoring import page_representatives, score_pages
from kvtransit.kernels.quant import int_quantise_roundtrip
from kvtransit.model.module.budget import PUBLISHED_OPS, KernelDeclaration


def _kv(shape=(2, 2, 3, 100, 64), dtype=ml_dtypes.bfloat16, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _rel(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_every_codec_inverts_from_header_and_payload_bytes_alone(name):
    kv = _kv()
    enc = get_codec(name).encode(kv)
    assert isinstance(enc, Encoded) and enc.payload.flags.c_contiguous
    assert len(enc.header) < MAX_HEADER_BYTES
    out = decode(enc.header, enc.payload.tobytes())
    assert out.shape == kv.shape and out.dtype == kv.dtype
    assert _rel(out, kv) < {"none": 1e-9, "fp8": 0.04, "fp4-block": 0.15, "freq-keep-k": 0.8,
                          "kivi-2": 0.45, "kivi-3": 0.2}[name]


@pytest.mark.parametrize("name,ratio", [("none", 1.0), ("fp4-block", 64 / 17), ("kivi-2", 16 / 3), ("kivi-3", 4.0)])
def test_wire_ratio_vs_bfloat16(name, ratio):
    kv = _kv((3, 64, 64))
    assert kv.nbytes / get_codec(name).encode(kv).payload.nbytes == pytest.approx(ratio)


def test_fp8_uses_e4m3_codes_and_one_float32_scale_per_block():
    kv = _kv((4, 64, 64))
    enc = get_codec("fp8", block=64).encode(kv)
    assert enc.payload.nbytes == kv.size + 4 * kv.size // 64


def test_fp4_block_of_other_size_is_refused():
    with pytest.raises(KernelInputError, match="fixed at 32"):
        get_codec("fp4-block", block=64)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_declarations_come_from_the_model(name):
    codec = get_codec(name)
    assert isinstance(codec.declaration, KernelDeclaration) and codec.declaration.name == name
    assert codec.name == name and isinstance(codec.params, dict)


def test_band_keep_declaration_is_in_the_published_set_and_carries_block_and_precision():
    decl = get_codec("freq-keep-k", keep=0.25, block=1024, precision_bits=8).declaration
    assert decl.ratio == 4.0 and decl.transform_length == 1024 and decl.precision_bits == 8
    assert decl.op_types <= PUBLISHED_OPS


@pytest.mark.parametrize("bad,match", [
    (np.zeros(5, np.float32), ">= 2 dims"),
    (np.zeros((4, 8), np.int32), "unsupported KV dtype"),
])
def test_bad_layout_or_dtype_is_a_clear_error(bad, match):
    with pytest.raises(KernelInputError, match=match):
        get_codec("freq-keep-k").encode(bad)


@pytest.mark.parametrize("kwargs,match", [
    ({"block": 1}, "block must be >= 2"),
    ({"keep": 0.0}, r"keep must be in \(0, 1\]"),
    ({"keep": 1.5}, r"keep must be in \(0, 1\]"),
    ({"keep": float("nan")}, r"keep must be in \(0, 1\]"),
    ({"variant": "wavelet"}, "unknown band-keep variant"),
    ({"backend": "cufft"}, "unknown FFT backend"),
])
def test_bad_band_keep_parameters_are_refused(kwargs, match):
    with pytest.raises(KernelInputError, match=match):
        get_codec("freq-keep-k", **kwargs)


def test_sinks_longer_than_the_sequence_are_refused():
    with pytest.raises(KernelInputError, match="sinks=8 is larger than the sequence"):
        get_codec("freq-keep-k", sinks=8).encode(_kv((2, 5, 8)))


def test_unknown_codec_names_the_choices():
    with pytest.raises(KernelInputError, match="choose from"):
        get_codec("zstd")


@pytest.mark.parametrize("name", CODEC_NAMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_nan_or_inf_is_rejected_with_count_and_first_index(name, dtype):
    kv = _kv((2, 3, 80, 16), dtype)
    kv[1, 2, 70, 3] = np.nan
    kv[1, 2, 75, 0] = np.inf
    with pytest.raises(KernelInputError, match=r"2 NaN/Inf value\(s\), first at index \(1, 2, 70, 3\)"):
        get_codec(name).encode(kv)


def test_header_is_checked_before_the_payload_is_trusted():
    enc = get_codec("freq-keep-k").encode(_kv((2, 70, 8)))
    with pytest.raises(KernelInputError, match="bad magic"):
        decode(b"XXXX" + enc.header[4:], enc.payload)
    with pytest.raises(KernelInputError, match="header implies"):
        decode(enc.header, enc.payload.tobytes()[:-2])
    with pytest.raises(KernelInputError, match="is for codec 'freq-keep-k'"):
        get_codec("fp8").decode(enc.header, enc.payload)


def test_header_round_trips_through_struct():
    h = Header("freq-keep-k", "bfloat16", (30, 2, 3, 517, 64), (64, 4, 32, 1, 0, 8))
    assert Header.unpack(h.pack()) == h


def test_int_baselines_store_bits_per_value_plus_a_scale_per_group():
    x = _kv((4, 64, 64), np.float32)
    out8, bytes8 = int_quantise_roundtrip(x, 8)
    out4, bytes4 = int_quantise_roundtrip(x, 4)
    assert bytes8 == x.size + 2 * x.size // 32 and bytes4 == x.size // 2 + 2 * x.size // 32
    assert _rel(out8, x) < 0.01 < _rel(out4, x) < 0.15


def test_page_scoring_is_a_dot_product_with_each_page_mean_key():
    keys = _kv((3, 70, 16), np.float32)
    q = _kv((3, 16), np.float32, seed=1)
    pages = page_representatives(keys, 32)
    assert pages.shape == (3, 3, 16)
    np.testing.assert_allclose(pages[:, 2], keys[:, 64:].mean(axis=1), rtol=1e-6)
    scores = score_pages(q, pages)
    np.testing.assert_allclose(scores[1, 0], q[1] @ keys[1, :32].mean(axis=0), rtol=1e-5)
