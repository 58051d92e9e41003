"""Synthetic KV: deterministic, shaped like real KV (K smooth, V rough), cheap windows of a template bank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ml_dtypes import bfloat16

from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.synthetic_kv import SyntheticKv


@pytest.fixture(scope="module")
def kv():
    return SyntheticKv(layers=4, kv_heads=2, head_dim=8, seed=1, bank_tokens=1024)


def test_layout_dtype_and_contiguity(kv):
    layer = kv.layer(request_id=3, layer=1, tokens=300)
    assert layer.shape == (2, 2, 300, 8) and layer.dtype == bfloat16 and layer.flags.c_contiguous


def test_same_seed_and_request_same_bytes_in_another_process_instance(kv):
    again = SyntheticKv(layers=4, kv_heads=2, head_dim=8, seed=1, bank_tokens=1024)
    assert kv.layer(5, 2, 700).tobytes() == again.layer(5, 2, 700).tobytes()


def test_requests_layers_and_seeds_differ(kv):
    a = kv.layer(5, 2, 200).tobytes()
    assert a != kv.layer(6, 2, 200).tobytes()
    assert a != kv.layer(5, 3, 200).tobytes()
    assert a != SyntheticKv(4, 2, 8, seed=2, bank_tokens=1024).layer(5, 2, 200).tobytes()


def test_prompts_longer_than_the_bank_wrap_around(kv):
    long = kv.layer(1, 0, 2500).astype(np.float32)
    assert long.shape[-2] == 2500 and np.isfinite(long).all()


@pytest.mark.parametrize("first,tokens", [(0, 300), (512, 1024), (1000, 60), (1500, 2200)])
def test_a_window_from_token_first_is_those_tokens_of_the_whole_kv(kv, first, tokens):
    whole = kv.layer(9, 1, first + tokens)
    window = kv.layer(9, 1, tokens, first=first)
    assert window.tobytes() == np.ascontiguousarray(whole[:, :, first:, :]).tobytes()
    with pytest.raises(KernelInputError, match="first must be a whole number >= 0, got -1"):
        kv.layer(9, 1, tokens, first=-1)


def _roughness(x):
    """Mean squared token-to-token difference over variance: ~2 for white noise, ~0 for smooth signals."""
    x = x - x.mean(axis=-2, keepdims=True)
    return float((np.diff(x, axis=-2) ** 2).mean() / (x ** 2).mean())


def test_k_is_smoother_than_v_along_tokens(kv):
    layer = kv.layer(0, 0, 1000).astype(np.float32)[:, :, 1:, :]  # past the sink token
    assert _roughness(layer[0]) < 0.75 * _roughness(layer[1])


def test_k_has_per_channel_offsets(kv):
    k = kv.layer(0, 0, 1000).astype(np.float32)[0, :, 1:, :]
    channel_means = k.mean(axis=1)
    assert channel_means.std() > 0.3  # offsets, not zero-mean noise


def test_the_sink_token_stands_apart(kv):
    layer = kv.layer(0, 0, 1000).astype(np.float32)
    assert np.abs(layer[:, :, 0, :]).mean() > 2 * np.abs(layer[:, :, 1:, :]).mean()


def test_out_buffer_is_filled_in_place(kv):
    out = np.empty((2, 2, 64, 8), dtype=bfloat16)
    assert kv.layer(9, 1, 64, out=out) is out
    with pytest.raises(KernelInputError, match="out must be"):
        kv.layer(9, 1, 65, out=out)


@pytest.mark.parametrize("kwargs,match", [({"layer": 4}, "layer must be in 0..3"), ({"tokens": 0}, "tokens")])
def test_bad_arguments_are_named(kv, kwargs, match):
    args = {"request_id": 0, "layer": 0, "tokens": 10} | kwargs
    with pytest.raises(KernelInputError, match=match):
        kv.layer(**args)


def test_request_returns_every_layer(kv):
    assert len(kv.request(2, 50)) == 4


SAMPLE = Path(__file__).resolve().parents[1] / "data" / "smollm2_kv_sample.npz"


@pytest.mark.skipif(not SAMPLE.exists(), reason="tests/data/smollm2_kv_sample.npz not present")
def test_templates_seeded_from_real_kv_keep_its_channels_and_sink():
    real = np.load(SAMPLE, allow_pickle=False)
    kv = SyntheticKv(layers=2, kv_heads=3, head_dim=64, seed=1, bank_tokens=1536, sample_path=str(SAMPLE))
    layer = kv.layer(0, 0, 100).astype(np.float32)
    sources = sorted(k[:-2] for k in real.files if k.endswith(".k"))
    first_k = real[f"{sources[0]}.k"][0].astype(np.float32)  # [heads, tokens, hd] of the first (text, layer)
    assert np.allclose(layer[0, :, 0, :], first_k[:, 0, :], rtol=1e-2, atol=1e-2)  # the real sink row
    body = first_k[:, 1:, :]
    window = layer[0, :, 1:, :]
    # every token row of the window is one of the real rows (mirror-tiled), to BF16 precision
    flat_body = body.transpose(1, 0, 2).reshape(body.shape[1], -1)
    for row in window.transpose(1, 0, 2).reshape(99, -1)[:5]:
        assert np.min(np.abs(flat_body - row).max(axis=1)) < 0.1


def test_a_missing_sample_is_a_named_error(tmp_path):
    with pytest.raises(KernelInputError, match="cannot read it"):
        SyntheticKv(1, 1, 8, seed=1, sample_path=str(tmp_path / "nope.npz"))
