"""kernels/ring_attention.py: blockwise ring attention is exact without a codec; a codec runs once per hop."""

from __future__ import annotations

import numpy as np
import pytest

from kvtransit.kernels import ring_attention as ring
from kvtransit.kernels.accuracy import attention_outputs
from kvtransit.kernels.errors import KernelInputError


def _qkv(seed: int = 0, layers: int = 2, q_heads: int = 4, kv_heads: int = 2, tokens: int = 64, d: int = 8):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((layers, q_heads, tokens, d))
    k = rng.standard_normal((layers, kv_heads, tokens, d))
    v = rng.standard_normal((layers, kv_heads, tokens, d))
    return q, np.arange(tokens), k, v


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_ring_blockwise_attention_equals_full_attention_in_float64(n):
    q, pos, k, v = _qkv()
    got = ring.ring_attention(q, pos, k, v, n).output
    for layer in range(q.shape[0]):  # the reference is kernels/accuracy.py's one-shot softmax, not this module's
        ref = attention_outputs(q[layer], k[layer], v[layer], pos)
        np.testing.assert_allclose(got[layer], ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_hop_count_is_n_minus_one_per_layer(n):
    q, pos, k, v = _qkv()
    calls: list[int] = []

    def counting(kv: np.ndarray, hop: int) -> np.ndarray:
        calls.append(hop)
        return kv

    result = ring.ring_attention(q, pos, k, v, n, counting)
    assert result.hops_per_layer == n - 1
    # Every block is passed on n − 1 times (each frame carries every layer, so per layer too): n blocks × (n − 1).
    assert sorted(calls) == sorted(list(range(1, n)) * n)


def test_a_block_reaching_a_rank_after_h_hops_went_through_the_codec_h_times():
    q, pos, k, v = _qkv(tokens=32)
    bumped = ring.ring_attention(q, pos, k, v, 4, lambda kv, hop: kv + np.array([0.0, 1.0])[None, :, None, None, None])
    # V of the block of rank j, seen by rank i, is V + (i − j) mod 4: check one query of rank 3 on blocks 0..3.
    expected_v = v.copy()
    for j in range(4):
        expected_v[:, :, j * 8 : (j + 1) * 8] += (3 - j) % 4
    ref = attention_outputs(q[0][:, 24:], k[0], expected_v[0], pos[24:])
    np.testing.assert_allclose(bumped.output[0][:, 24:], ref, rtol=1e-12)


def test_an_idempotent_codec_adds_no_error_after_the_first_hop_and_noise_does():
    q, pos, k, v = _qkv(tokens=128, d=64, kv_heads=1, q_heads=1, layers=1)
    exact = ring.error_after_hops(q, pos, k, v, 4, ring.wire_codec("freq-keep-k", keep=0.5, sinks=4))
    assert exact.after_hops[0] > 0.05
    assert exact.after_hops[-1] == pytest.approx(exact.one_pass, rel=0.02)
    # Keeping every coefficient at 4 bits is noise alone, drawn afresh each hop: it adds up as √h (√3 after 3 hops).
    noisy = ring.error_after_hops(q, pos, k, v, 4, ring.wire_codec("freq-keep-k", keep=1.0, sinks=0,
                                                                    precision_bits=4))
    assert noisy.kv_after_hops[-1] / noisy.kv_after_hops[0] == pytest.approx(3**0.5, rel=0.1)


def test_a_ring_that_cannot_split_the_tokens_evenly_is_refused_with_the_sizes_that_do():
    q, pos, k, v = _qkv(tokens=36)
    with pytest.raises(KernelInputError, match=r"ring of 8 ranks cannot split 36 tokens into equal blocks "
                                               r"\(ring sizes that do: 2, 4\)"):
        ring.ring_attention(q, pos, k, v, 8)


def test_a_ring_of_one_has_no_hop_to_measure():
    q, pos, k, v = _qkv()
    with pytest.raises(KernelInputError, match="no hop to measure"):
        ring.error_after_hops(q, pos, k, v, 1, ring.wire_codec("fp8"))
    with pytest.raises(KernelInputError, match="ring size must be an integer >= 1, got 0"):
        ring.hops_per_layer(0)
