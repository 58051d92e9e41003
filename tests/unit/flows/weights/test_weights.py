"""Weights and LoRA adapters as a flow (flows/weights/model.py, docs/reference.md §1, §7), and the lossless rule on them
(model/module/budget.py: flow_check). Every expected figure is computed by hand in the test's comment."""

from __future__ import annotations

import pytest

from kvtransit.flows.weights.model import (
    AdapterAccess,
    AdapterLru,
    AdapterShape,
    ZipfPopularity,
    adapter_wait_s,
    page_adapters,
    weight_bytes,
    weight_load,
)
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.catalog.models import model_by_name
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import KernelDeclaration, flow_check


def test_llama3_8b_weights_are_reference_16_06_gb_and_load_over_pcie5_in_0_25_s():
    # docs/reference.md §1: 16.06 GB; 32·(2·4096² + 2·4096·1024 + 3·4096·14336) + 2·128256·4096 = 8,029,995,008 params.
    assert weight_bytes(model_by_name("llama3-8b")) == 2 * 8_029_995_008
    load = weight_load(model_by_name("llama3-8b"), link_by_name("pcie5"))
    assert load.seconds == pytest.approx(5e-6 + 16_059_990_016 / 64e9)
    assert round(load.seconds, 2) == 0.25


def test_smollm2_rank8_adapter_bytes_use_its_gqa_kv_width():
    # d_model 576, kv_dim = 3 kv heads × 64 = 192. 2·r·(d_in + d_out)·2 B with r = 8:
    # q, o: 2·8·1152·2 = 36,864; k, v: 2·8·768·2 = 24,576; a layer 122,880; 30 layers 3,686,400 B.
    shape = AdapterShape(model_by_name("smollm2-135m"), rank=8)
    assert shape.projection_shape("k") == (576, 192)
    assert [shape.projection_bytes(p) for p in ("q", "k", "v", "o")] == [36_864, 24_576, 24_576, 36_864]
    assert shape.nbytes == 3_686_400


def test_llama3_8b_rank16_adapter_is_54_5_mb_and_its_load_is_latency_plus_bytes_over_bandwidth():
    # d 4096, kv_dim 1024: q, o 2·16·8192·2 = 524,288; k, v 2·16·5120·2 = 327,680; ×32 layers = 54,525,952 B.
    shape = AdapterShape(model_by_name("llama3-8b"), rank=16)
    assert shape.nbytes == 54_525_952
    eth = link_by_name("eth-100g")
    assert shape.load(eth).seconds == pytest.approx(eth.latency_s + 54_525_952 / eth.bandwidth_Bps)


def test_adapter_rank_must_be_a_positive_integer_within_the_width():
    model = model_by_name("smollm2-135m")
    with pytest.raises(ConfigError, match="rank must be an integer >= 1"):
        AdapterShape(model, rank=0)
    with pytest.raises(ConfigError, match="exceeds smollm2-135m's d_model 576"):
        AdapterShape(model, rank=577)
    with pytest.raises(ConfigError, match="unknown projection 'gate'"):
        AdapterShape(model, rank=8).projection_bytes("gate")


def test_lru_hits_misses_and_evicts_least_recently_used():
    # Two slots: 0 miss, 1 miss, 0 hit (1 is now LRU), 2 miss evicts 1, 1 miss evicts 0, 3 miss evicts 2.
    assert page_adapters([0, 1, 0, 2, 1, 3], capacity=2) == [
        AdapterAccess(0, hit=False), AdapterAccess(1, hit=False), AdapterAccess(0, hit=True),
        AdapterAccess(2, hit=False, evicted=1), AdapterAccess(1, hit=False, evicted=0),
        AdapterAccess(3, hit=False, evicted=2),
    ]
    lru = AdapterLru(2)
    for a in (5, 6, 5):
        lru.access(a)
    assert lru.resident == (6, 5)


def test_zipf_draws_are_the_same_sequence_for_the_same_seed_and_follow_one_over_rank():
    a, b = ZipfPopularity(50, 1.0, seed=7).draws(500), ZipfPopularity(50, 1.0, seed=7).draws(500)
    assert a == b
    assert ZipfPopularity(50, 1.0, seed=8).draws(500) != a
    # N = 3, s = 1: weights 1, 1/2, 1/3 over 11/6 → 6/11, 3/11, 2/11.
    zipf = ZipfPopularity(3, 1.0, seed=1)
    assert zipf.probabilities == pytest.approx((6 / 11, 3 / 11, 2 / 11))
    draws = zipf.draws(30_000)
    # Seeded, so this cannot flake; 3 standard deviations of a 30,000-draw share is under 0.9 %.
    assert [draws.count(i) / len(draws) for i in range(3)] == pytest.approx([6 / 11, 3 / 11, 2 / 11], abs=0.009)


def test_zipf_and_lru_hit_sequence_is_deterministic_for_a_seed():
    ids = ZipfPopularity(100, 1.1, seed=3).draws(200)
    first, again = page_adapters(ids, capacity=8), page_adapters(list(ids), capacity=8)
    assert first == again
    hits = sum(a.hit for a in first)
    assert 0 < hits < len(first)  # popular adapters stay resident, the tail misses


def test_adapter_wait_is_the_load_time_on_a_miss_and_zero_on_a_hit():
    shape = AdapterShape(model_by_name("smollm2-135m"), rank=8)
    link = link_by_name("eth-100g")
    waits = adapter_wait_s(page_adapters([1, 1, 2], capacity=4), shape, link)
    assert waits == [pytest.approx(link.latency_s + 3_686_400 / link.bandwidth_Bps), 0.0,
                     pytest.approx(link.latency_s + 3_686_400 / link.bandwidth_Bps)]


@pytest.mark.parametrize("bad, message", [(0, "adapters must be an integer >= 1"),
                                          (True, "adapters must be an integer >= 1")])
def test_zipf_refuses_a_bad_adapter_count(bad, message):
    with pytest.raises(ConfigError, match=message):
        ZipfPopularity(bad)


def test_a_lossy_kernel_on_the_weight_flow_is_refused_in_one_line():
    bandkeep = KernelDeclaration("bandkeep", ratio=4.0, op_types=frozenset({"fft", "gather"}),
                                 transform="dct", transform_length=64)
    with pytest.raises(ConfigError) as refused:
        flow_check(bandkeep, "weights")
    message = str(refused.value)
    assert "\n" not in message
    assert "'bandkeep' refused on flow 'weights'" in message and "lossless" in message
    with pytest.raises(ConfigError, match="refused on flow 'adapters'"):
        flow_check(bandkeep, "adapters")


def test_a_lossless_kernel_runs_on_the_weight_flow_and_a_lossy_one_on_kv():
    zstd = KernelDeclaration("zstd", ratio=1.3, op_types=frozenset({"comparison"}), lossless=True)
    flow_check(zstd, "weights")
    flow_check(KernelDeclaration("identity", lossless=True), "weights")
    flow_check(KernelDeclaration("fp8", ratio=2.0, op_types=frozenset({"rounding"})), "kv")


def test_a_lossless_claim_through_an_analogue_path_narrower_than_bf16_is_refused_on_weights():
    narrow = KernelDeclaration("optical-identity", lossless=True, precision_bits=8)
    with pytest.raises(ConfigError, match="delivers 8 bits < the 16 bits of a BF16 weight"):
        flow_check(narrow, "weights")
    flow_check(KernelDeclaration("optical-identity", lossless=True, precision_bits=16), "weights")
