"""The codec's inverse at the receiving end: decode's GPU inverts a GPU-encoded KV when it admits it
(Scenario.gpu_codec_inverse_*, model/serving/decode_plan.py); an in-transit hand-off pays a decoding module at the far
end (model/energy.handoff_module_energy_j)."""

from __future__ import annotations

import math

import pytest

from kvtransit.model.cost.energy import handoff_module_energy_j, module_energy_j
from kvtransit.model.cost.roofline import decode_step_s, decode_work, step_energy_j, step_time
from kvtransit.model.module.budget import Module
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.decode_plan import plan_decode_step

GPU = dict(compress_at="gpu", dilation=2.0)


def test_the_inverse_transform_costs_what_the_forward_does_and_streams_compressed_in_full_out():
    s = Scenario.build(codec="freq-keep-k", **GPU)
    full = s.model_spec.kv_bytes(2048)
    decl = s.codec_declaration
    inverse = s.gpu_codec_inverse_work(2048)
    assert inverse.flops == pytest.approx(full * 1.25 * math.log2(decl.transform_length))
    assert inverse.flops == pytest.approx(s.gpu_codec_work(2048).flops)  # band-keep declares no other ops
    assert inverse.hbm_bytes == pytest.approx(full / decl.ratio + full)


@pytest.mark.parametrize("codec, forward_ops_per_value", [("fp8", 1), ("fp4-block", 2)])
def test_a_requantisers_decode_is_one_op_per_value(codec, forward_ops_per_value):
    s = Scenario.build(codec=codec, **GPU)
    values = s.model_spec.kv_bytes(1024) / 2  # BF16 values
    assert s.gpu_codec_inverse_work(1024).flops == pytest.approx(values)
    assert s.gpu_codec_work(1024).flops == pytest.approx(values * forward_ops_per_value)


def test_the_inverse_time_is_its_roofline_with_no_overhead_and_zero_unless_the_codec_ran_on_the_gpu():
    s = Scenario.build(codec="freq-keep-k", **GPU)
    t = step_time(s.gpu_codec_inverse_work(4096), s.device_spec, s.gpus)
    assert s.gpu_codec_inverse_s(4096) == max(t.compute_s, t.memory_s) > 0
    assert Scenario(codec="freq-keep-k", compress_at="transit").gpu_codec_inverse_s(4096) == 0.0
    assert Scenario(codec="none", compress_at="gpu").gpu_codec_inverse_s(4096) == 0.0


def test_a_decode_step_that_admits_gpu_encoded_kv_holds_and_spends_the_inverse_of_each_admitted_request():
    s = Scenario.build(codec="freq-keep-k", **GPU)
    model, device = s.model_spec, s.device_spec
    plan = plan_decode_step(s, 3, 5000, admitted_prompts=(1000, 2000))
    bare_s = decode_step_s(model, device, s.gpus, 3, 5000)
    assert plan.inverse_s == pytest.approx(s.gpu_codec_inverse_s(1000) + s.gpu_codec_inverse_s(2000))
    assert plan.model_s == pytest.approx(bare_s + plan.inverse_s) and plan.wall_s == pytest.approx(2 * plan.model_s)
    inverse_j = sum(step_energy_j(device, s.gpu_codec_inverse_work(p)) for p in (1000, 2000))
    assert plan.energy_j == pytest.approx(step_energy_j(device, decode_work(model, 3, 5000)) + inverse_j)
    # Nothing admitted, or the codec not on the GPU: the bare roofline step.
    for scenario, admitted in ((s, ()), (Scenario(codec="freq-keep-k", compress_at="transit"), (1000,))):
        bare = plan_decode_step(scenario, 3, 5000, admitted)
        assert bare.model_s == decode_step_s(model, device, scenario.gpus, 3, 5000) and bare.inverse_s == 0.0
        assert bare.energy_j == step_energy_j(device, decode_work(model, 3, 5000))


def test_an_in_transit_handoff_pays_the_encoding_module_and_the_decoding_one_on_the_wire_bytes():
    m = Module()
    assert handoff_module_energy_j(m, 1e9, 2.5e8) == pytest.approx((1e9 + 2.5e8) * 8 * 1e-12)
    assert handoff_module_energy_j(m, 1e9, 2.5e8) == module_energy_j(m, 1e9) + module_energy_j(m, 2.5e8)
