"""docs/reference.md §7's collectives, against values worked by hand (the arithmetic is in each test's comment)."""

from __future__ import annotations

import pytest

from kvtransit.flows.tp import model as c
from kvtransit.kernels import stream_sum
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.cost.roofline import decode_step_s, decode_work, prefill_work, step_time
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Module

LLAMA70 = MODELS["llama3-70b"]
MIXTRAL = MODELS["mixtral-8x7b"]
H100 = DEVICES["h100"]
NVLINK4 = LINKS["nvlink4"]


def test_scale_up_links_of_reference_section_7():
    for name, gbps in (("nvlink3", 300), ("nvlink4", 450), ("nvlink5", 900)):
        assert LINKS[name].bandwidth_Bps == pytest.approx(gbps * 1e9)
        assert LINKS[name].latency_s == pytest.approx(5e-6)


def test_activation_bytes_are_tokens_times_d_model_times_two():
    assert c.activation_bytes(LLAMA70, 1) == 16_384  # 1 × 8192 × 2 B
    assert c.activation_bytes(MIXTRAL, 8192) == 67_108_864  # 8192 × 4096 × 2 B


def test_ring_allreduce_is_two_n_minus_one_over_n_bytes_plus_two_n_minus_one_latencies():
    # n = 4, S = 16,384 B: 2·3/4 · 16384 / 450e9 = 54.613 ns; 2·3 · 5 µs = 30 µs
    assert c.ring_allreduce_s(16_384, 4, NVLINK4) == pytest.approx(30e-6 + 24_576 / 450e9, rel=1e-12)
    # n = 8, S = 1 MB on nvlink5: 2·7/8 · 1e6 / 900e9 = 1.9444 µs; 14 × 5 µs = 70 µs
    assert c.ring_allreduce_s(1e6, 8, LINKS["nvlink5"]) == pytest.approx(70e-6 + 1.75e6 / 900e9, rel=1e-12)
    assert c.ring_allreduce_s(16_384, 1, NVLINK4) == 0.0


def test_switch_allreduce_is_a_hop_up_the_sum_and_a_hop_down():
    # S = 16,384 B: hop = 5 µs + 16384/450e9 = 5.036409 µs; sum = 1 µs + 0.5·16384 / (1.6 · 450e9) = 1.011378 µs
    parts = c.switch_allreduce(16_384, 4, NVLINK4)
    assert parts.up_s == parts.down_s == pytest.approx(5e-6 + 16_384 / 450e9, rel=1e-12)
    assert parts.sum_s == pytest.approx(1e-6 + 8_192 / 720e9, rel=1e-12)
    assert parts.total_s == pytest.approx(11.0841956e-6, rel=1e-7)
    # The low budget (0.40 op per line byte) is below the sum's 0.50: the sum is slower than the wire.
    low = c.switch_sum_s(16_384, NVLINK4, Module(ops_per_byte=0.40))
    assert low == pytest.approx(1e-6 + 8_192 / (0.40 * 450e9), rel=1e-12)
    assert c.switch_allreduce(16_384, 1, NVLINK4).total_s == 0.0


def test_switch_sum_ops_per_byte_is_the_stream_sum_kernels_declaration():
    assert c.SUM_OPS_PER_BYTE == stream_sum.declaration(4).ops_per_byte == 0.50


def test_moe_dispatch_and_combine_bytes_and_time():
    # mixtral, 8192 tokens, top-2, EP2: 2 · 8192 · 2 · 4096 · 1/2 values × 2 B = 134,217,728 B
    assert c.alltoall_bytes(MIXTRAL, 8192, 2) == 134_217_728
    # over nvlink4: 134217728 / 450e9 = 298.26 µs, + 2·1 · 5 µs
    assert c.alltoall_s(MIXTRAL, 8192, 2, NVLINK4) == pytest.approx(134_217_728 / 450e9 + 10e-6, rel=1e-12)
    # EP8, one token: 2 · 1 · 2 · 4096 · 7/8 × 2 B = 28,672 B
    assert c.alltoall_bytes(MIXTRAL, 1, 8) == pytest.approx(28_672)


def test_experts_touched_is_e_times_one_minus_untouched_probability():
    assert c.experts_touched(8, 2, 1) == pytest.approx(2.0)  # one token touches its k experts
    assert c.experts_touched(8, 2, 2) == pytest.approx(3.5)  # 8 · (1 − 0.75²) = 8 · 0.4375
    assert c.experts_touched(8, 2, 8192) == pytest.approx(8.0)
    with pytest.raises(ConfigError, match="active experts"):
        c.experts_touched(8, 9, 1)


def test_moe_work_reads_touched_experts_and_charges_the_busiest_rank():
    base = prefill_work(MIXTRAL, [2])
    expert = 32 * 3 * 4096 * 14336  # L · 3 · d · d_ff, one expert
    work = c.moe_work(MIXTRAL, base, 2, expert_imbalance=1.5)
    assert work.hbm_bytes - base.hbm_bytes == pytest.approx((3.5 - 2) * expert * 2)
    assert work.flops - base.flops == pytest.approx(0.5 * 2 * expert * 2 * 2)  # (1.5 − 1) · 2 · P_e · k · tokens
    with pytest.raises(ConfigError, match="expert_imbalance must be >= 1"):
        c.moe_work(MIXTRAL, base, 2, expert_imbalance=0.5)


def test_tp_decode_step_is_the_roofline_on_n_gpus_plus_two_allreduces_a_layer():
    step = c.tp_decode_step(LLAMA70, H100, NVLINK4, tp=4, batch=1, context_total=2048)
    assert step.compute_s == pytest.approx(decode_step_s(LLAMA70, H100, 4, 1, 2048))
    assert step.allreduces == 160  # 2 × 80 layers
    assert step.allreduce_s == pytest.approx(160 * (30e-6 + 24_576 / 450e9))
    assert step.alltoall_s == 0.0
    assert step.total_s == pytest.approx(step.compute_s + step.allreduce_s)
    assert step.collective_share == pytest.approx(step.allreduce_s / step.total_s)


def test_ep_step_keeps_the_attention_allreduce_and_turns_the_mlps_into_dispatch_and_combine():
    step = c.tp_prefill_step(MIXTRAL, H100, NVLINK4, [2048] * 4, ep=2, allreduce="switch")
    assert (step.allreduces, step.alltoalls) == (32, 32)
    assert step.allreduce_each_s == pytest.approx(c.switch_allreduce(67_108_864, 2, NVLINK4).total_s)
    assert step.alltoall_each_s == pytest.approx(c.alltoall_s(MIXTRAL, 8192, 2, NVLINK4))
    work = c.moe_work(MIXTRAL, prefill_work(MIXTRAL, [2048] * 4), 8192)
    assert step.compute_s == pytest.approx(step_time(work, H100, 2).total_s)


def test_a_tp_size_that_does_not_divide_the_heads_names_the_valid_sizes():
    with pytest.raises(ConfigError,
                       match=r"TP 3 does not divide llama3-70b's 64 heads \(valid: 1, 2, 4, 8, 16, 32, 64\)"):
        c.tp_decode_step(LLAMA70, H100, NVLINK4, tp=3, batch=1, context_total=2048)


def test_ep_on_a_dense_model_is_refused_with_one_line():
    with pytest.raises(ConfigError, match="llama3-70b is dense"):
        c.tp_decode_step(LLAMA70, H100, NVLINK4, ep=2, batch=1, context_total=2048)
    with pytest.raises(ConfigError, match=r"EP 3 .*\(valid: 1, 2, 4, 8\)"):
        c.tp_decode_step(MIXTRAL, H100, NVLINK4, ep=3, batch=1, context_total=2048)


def test_unknown_allreduce_kind_names_the_choices():
    with pytest.raises(ConfigError, match="choose from: ring, switch"):
        c.parallel_step(LLAMA70, H100, decode_work(LLAMA70, 1, 0), 1, NVLINK4, tp=2, allreduce="tree")
