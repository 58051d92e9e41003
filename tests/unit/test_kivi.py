"""KIVI-style 2/3-bit requantisers (kernels/kivi.py, codecs kivi-2 and kivi-3)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtransit.kernels import KernelInputError, decode, get_codec, kivi
from kvtransit.kernels.header import Header
from kvtransit.kernels.registry import KiviCodec
from kvtransit.model.catalog.codecs import CODECS, KIVI_GROUP
from kvtransit.model.scenario import Scenario

KIVI = ("kivi-2", "kivi-3")
BITS = {"kivi-2": 2, "kivi-3": 3}


def _kv(shape, dtype=ml_dtypes.bfloat16, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _step_per_value(enc, shape, bits):
    """Each value's group step (float32, in `shape`), read back from the payload."""
    layout = kivi.KiviLayout(shape, KIVI_GROUP)
    steps, _ = kivi.group_params(enc.payload, layout, bits)
    steps = steps.astype(np.float32)
    t, d, g = layout.tokens, layout.head_dim, KIVI_GROUP
    k = steps[: layout.key_groups].reshape(layout.key_rows, math.ceil(t / g), d)
    k = np.repeat(k, g, axis=1)[:, :t]
    v = steps[layout.key_groups :].reshape(layout.value_rows, t, math.ceil(d / g))
    v = np.repeat(v, g, axis=2)[:, :, :d]
    return np.concatenate([k.reshape(-1), v.reshape(-1)]).reshape(shape)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(KIVI), rows=st.integers(1, 5), tokens=st.integers(1, 70), head_dim=st.integers(1, 70),
       scale=st.sampled_from([1e-3, 1.0, 300.0]), seed=st.integers(0, 2**16))
def test_roundtrip_error_is_at_most_half_a_step_of_its_group(name, rows, tokens, head_dim, scale, seed):
    shape = (rows, tokens, head_dim)
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    enc = get_codec(name).encode(x)
    out = decode(enc.header, enc.payload.tobytes())
    half_step = _step_per_value(enc, shape, BITS[name]) / 2
    # float32 arithmetic on the way: a few ulps of the values' magnitude.
    slack = 4 * np.finfo(np.float32).eps * (np.abs(x) + half_step)
    assert np.all(np.abs(out - x) <= half_step + slack)


@pytest.mark.parametrize("name", KIVI)
@pytest.mark.parametrize("shape", [(16, 128, 128), (2, 3, 80, 16), (1, 5, 7), (3, 33, 65)])
def test_payload_is_exactly_the_packed_codes_plus_four_bytes_a_group(name, shape):
    bits, g = BITS[name], KIVI_GROUP
    rows, t, d = math.prod(shape[:-2]), shape[-2], shape[-1]
    groups = rows // 2 * d * math.ceil(t / g) + (rows - rows // 2) * t * math.ceil(d / g)
    enc = get_codec(name).encode(_kv(shape))
    assert enc.payload.nbytes == math.ceil(math.prod(shape) * bits / 8) + 4 * groups


@pytest.mark.parametrize("name", KIVI)
def test_declared_ratio_is_the_live_ratio_on_whole_groups_and_bounds_ragged_ones(name):
    # The layout the declaration assumes: head_dim 128, tokens a multiple of 32 (a chunk of 8 K + 8 V heads).
    kv = _kv((16, 256, 128))
    assert kv.nbytes / get_codec(name).encode(kv).payload.nbytes == pytest.approx(CODECS[name].ratio)
    ragged = _kv((16, 250, 128))  # a ragged last group of tokens costs its scale for fewer values
    assert ragged.nbytes / get_codec(name).encode(ragged).payload.nbytes < CODECS[name].ratio
    assert CODECS["kivi-2"].ratio == pytest.approx(16 / 3) and CODECS["kivi-3"].ratio == pytest.approx(4.0)


@pytest.mark.parametrize("bits", [2, 3])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 31, 1000])
def test_packing_round_trips_in_exactly_n_bits_each(bits, n):
    codes = np.random.default_rng(n).integers(0, 2**bits, n).astype(np.uint8)
    packed = kivi.pack(codes, bits)
    assert packed.size == math.ceil(n * bits / 8)
    np.testing.assert_array_equal(kivi.unpack(packed, n, bits), codes)


def test_three_bit_codes_are_eight_to_three_bytes_little_endian():
    packed = kivi.pack(np.arange(8, dtype=np.uint8), 3)
    word = sum(i << (3 * i) for i in range(8))
    assert packed.tobytes() == word.to_bytes(3, "little")


@pytest.mark.parametrize("name", KIVI)
def test_a_key_channel_outlier_hurts_only_its_channel(name):
    # Keys are grouped per channel along tokens (KIVI): a large channel in K widens the step of its own groups only.
    rows, t, d = 4, 64, 64  # 2 key rows, 2 value rows
    kv = _kv((rows, t, d), np.float32)
    spiked = kv.copy()
    spiked[0, :, 5] *= 100.0
    codec = get_codec(name)
    err = np.abs(decode(*_enc(codec, spiked)) - spiked)
    base = np.abs(decode(*_enc(codec, kv)) - kv)
    others = np.ones(d, bool)
    others[5] = False
    np.testing.assert_array_equal(err[0][:, others], base[0][:, others])  # the other channels: bit-identical
    assert err[0][:, 5].mean() > 10 * base[0][:, 5].mean()


@pytest.mark.parametrize("name", KIVI)
def test_a_value_token_outlier_hurts_only_its_token(name):
    # Values are grouped per token along channels: a large token in V widens its own token's groups only.
    kv = _kv((4, 64, 64), np.float32)
    spiked = kv.copy()
    spiked[3, 10, :] *= 100.0
    codec = get_codec(name)
    err = np.abs(decode(*_enc(codec, spiked)) - spiked)
    base = np.abs(decode(*_enc(codec, kv)) - kv)
    others = np.ones(64, bool)
    others[10] = False
    np.testing.assert_array_equal(err[3][others], base[3][others])
    assert err[3][10].mean() > 10 * base[3][10].mean()


def _enc(codec, x):
    enc = codec.encode(x)
    return enc.header, enc.payload


def test_three_bits_beat_two():
    kv = _kv((16, 128, 128))
    errors = {}
    for name in KIVI:
        enc = get_codec(name).encode(kv)
        out = decode(enc.header, enc.payload).astype(np.float64)
        errors[name] = np.linalg.norm(out - kv.astype(np.float64)) / np.linalg.norm(kv.astype(np.float64))
    assert errors["kivi-3"] < 0.5 * errors["kivi-2"] < 0.25


@pytest.mark.parametrize("name", KIVI)
def test_header_carries_bits_and_group_and_decodes_alone(name):
    kv = _kv((2, 8, 40, 128))
    enc = get_codec(name).encode(kv)
    h = Header.unpack(enc.header)
    assert (h.codec, h.params, h.shape, h.dtype) == (name, (BITS[name], KIVI_GROUP), kv.shape, "bfloat16")
    out = decode(enc.header, enc.payload.tobytes())
    assert out.dtype == kv.dtype and out.shape == kv.shape


def test_a_header_group_other_than_the_live_one_still_decodes():
    x = _kv((4, 40, 24), np.float32)
    codec = KiviCodec(3, group=8)  # the header, not the live default, says how the payload was grouped
    enc = codec.encode(x)
    assert Header.unpack(enc.header).params == (3, 8)
    np.testing.assert_array_equal(decode(enc.header, enc.payload), codec.decode(enc.header, enc.payload))


@pytest.mark.parametrize("name", KIVI)
def test_nan_is_refused_with_its_index(name):
    kv = _kv((4, 50, 16))
    kv[2, 7, 3] = np.nan
    with pytest.raises(KernelInputError, match=r"1 NaN/Inf value\(s\), first at index \(2, 7, 3\)"):
        get_codec(name).encode(kv)


def test_finite_values_beyond_float16_are_refused_by_name():
    kv = _kv((2, 40, 32), np.float32)
    kv[0, 0, 0] = 1e6
    with pytest.raises(KernelInputError, match="exceeds float16"):
        get_codec("kivi-2").encode(kv)


@pytest.mark.parametrize("mutate,match", [
    (lambda h: Header("kivi-2", h.dtype, h.shape, (3, 32)), "bits 3, the codec's name says 2"),
    (lambda h: Header("kivi-2", h.dtype, h.shape, (2, 0)), "group 0 < 1"),
    (lambda h: Header("kivi-2", h.dtype, (h.shape[0], h.shape[1] + 1, h.shape[2]), h.params), "header implies"),
])
def test_a_bad_header_is_refused(mutate, match):
    enc = get_codec("kivi-2").encode(_kv((4, 40, 32)))
    bad = mutate(Header.unpack(enc.header)).pack()
    with pytest.raises(KernelInputError, match=match):
        decode(bad, enc.payload)


def test_a_truncated_payload_is_refused():
    enc = get_codec("kivi-3").encode(_kv((4, 40, 32)))
    with pytest.raises(KernelInputError, match="header implies"):
        decode(enc.header, enc.payload.tobytes()[:-1])


@pytest.mark.parametrize("name", KIVI)
def test_declaration_needs_rounding_and_comparison_and_the_scenario_takes_the_codec(name):
    decl = get_codec(name).declaration
    assert decl.op_types == frozenset({"rounding", "comparison"}) and decl.ops_per_byte == 2.5
    assert not decl.in_published_set
    Scenario(codec=name)  # a codec choice the scenario accepts


def test_the_middlebox_block_does_not_change_the_group():
    # The middlebox passes the scenario's block (band-keep's transform length) to every codec.
    assert get_codec("kivi-2", block=64).params == {"bits": 2, "group": KIVI_GROUP}
