"""Accuracy measurement: definitions pinned on synthetic KV, and the real SmolLM2 sample when it exists."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvtransit.cli import main
from kvtransit.kernels.accuracy import (
    accuracy_table,
    attention_outputs,
    centred_relative_error,
    load_sample,
    synthetic_sample,
)

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "smollm2_kv_sample.npz"


def test_gaussian_band_keep_error_is_sqrt_one_minus_kept_over_n():
    sample = synthetic_sample("gaussian", tokens=4 + 1024, layers=2)
    rows = {r.method: r for r in accuracy_table(sample, keep=0.5, sinks=4)}
    expected = math.sqrt(1 - 0.5) * math.sqrt(1024 / 1028)  # the 4 sinks are exact
    assert rows["freq-keep-k"].k_err == pytest.approx(expected, rel=0.02)
    assert rows["freq-keep-k"].v_err == pytest.approx(expected, rel=0.02)
    assert rows["exact"].k_err < 0.005 and rows["int8"].k_err < 0.01
    assert rows["freq-keep-k"].bytes_ratio == pytest.approx(rows["subsample"].bytes_ratio, rel=0.01)


def test_smooth_kv_is_where_band_keep_beats_subsampling():
    rows = {r.method: r for r in accuracy_table(synthetic_sample("structured"), keep=0.5)}
    assert rows["freq-keep-k"].k_err_centred < rows["subsample"].k_err_centred
    assert rows["freq-keep-k"].attn_err < rows["subsample"].attn_err


def test_attention_is_causal_and_groups_query_heads_onto_kv_heads():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((4, 1, 8)), rng.standard_normal((2, 10, 8)), rng.standard_normal((2, 10, 8))
    out = attention_outputs(q, k, v, np.array([0]))
    np.testing.assert_allclose(out[:2, 0], v[0, 0].repeat(1)[None].repeat(2, 0))  # pos 0 sees key 0 only
    np.testing.assert_allclose(out[2:, 0], v[1, 0][None].repeat(2, 0))


def test_centred_error_removes_each_blocks_mean():
    ref = np.ones((1, 128, 4)) * 5 + np.random.default_rng(0).standard_normal((1, 128, 4))
    assert centred_relative_error(ref, ref + 10.0, block=64) == pytest.approx(0.0, abs=1e-12)


def test_cli_prints_json_for_synthetic_kv(capsys):
    assert main(["accuracy", "--synthetic", "gaussian", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    methods = [r["method"] for r in data["tables"]["gaussian"]]
    assert methods == ["exact", "freq-keep-k", "subsample", "int8", "int4"]


def test_cli_bad_keep_is_one_line_exit_2(capsys):
    assert main(["accuracy", "--synthetic", "gaussian", "--keep", "0"]) == 2
    assert "keep must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.skipif(not SAMPLE.exists(), reason=f"real KV sample not generated yet: {SAMPLE}")
def test_real_smollm2_sample_runs_and_sinks_matter():
    samples = load_sample(str(SAMPLE))
    sample = samples["prose"]
    assert sample.k.shape[1] == 3 and sample.q.shape[1] == 9 and sample.k.shape[-1] == 64
    with_sinks = {r.method: r for r in accuracy_table(sample, keep=0.5, sinks=4)}
    without = accuracy_table(sample, keep=0.5, sinks=0, baselines=False)[0]
    assert 0 < with_sinks["freq-keep-k"].k_err < 1 and 0 < with_sinks["freq-keep-k"].v_err < 1
    assert with_sinks["freq-keep-k"].attn_err < without.attn_err  # docs/reference.md §6: the first token holds the mass
