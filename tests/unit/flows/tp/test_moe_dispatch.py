"""FP8 dispatch on the MoE all-to-all: its bytes, where it may run, and its GPU casts, against
hand-computed values."""

from __future__ import annotations

import pytest

from kvtransit.flows.tp.model import alltoall_bytes, tp_decode_step, tp_prefill_step
from kvtransit.flows.tp.moe_dispatch import (
    DISPATCH_VALUE_BYTES,
    FP8_BLOCK,
    gpu_cast_s,
    gpu_cast_work,
    place_dispatch,
)
from kvtransit.kernels import quant
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.cost.roofline import HBM_EFFICIENCY
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Policy

MIXTRAL = MODELS["mixtral-8x7b"]  # k = 2 experts a token, d = 4,096


def test_the_models_fp8_bytes_are_what_the_kernel_sends():
    assert FP8_BLOCK == quant.DEFAULT_FP8_BLOCK
    assert DISPATCH_VALUE_BYTES["fp8"] == quant.fp8_payload_bytes(64 * FP8_BLOCK, FP8_BLOCK) / (64 * FP8_BLOCK)
    assert DISPATCH_VALUE_BYTES["bf16"] == MIXTRAL.bytes_per_value == 2


def test_fp8_dispatch_shrinks_only_the_dispatch_half_of_the_all_to_all():
    # 8,192 tokens, EP2: each way 8,192 · 2 · 4,096 · 1/2 = 33,554,432 values.
    each_way = 33_554_432
    assert alltoall_bytes(MIXTRAL, 8192, 2) == each_way * 4  # BF16 both ways (docs/reference.md §7: 2 · … × 2 B)
    assert alltoall_bytes(MIXTRAL, 8192, 2, "fp8") == each_way * (1.0625 + 2)


def test_the_gpu_casts_are_one_op_a_value_each_way_streaming_bf16_and_fp8_through_hbm():
    work = gpu_cast_work(MIXTRAL, 8192, 2)
    assert work.flops == 2 * 33_554_432
    assert work.hbm_bytes == 2 * 33_554_432 * (2 + 1.0625)
    h100 = DEVICES["h100"]
    # Fused into the layer: no step overhead, the slower of compute and HBM at docs/reference.md §3's efficiencies (here
    # HBM: 205.5 MB at 3.35 TB/s × 0.8, ~77 µs).
    assert gpu_cast_s(MIXTRAL, h100, 8192, 2) == pytest.approx(work.hbm_bytes / (h100.hbm_Bps * HBM_EFFICIENCY),
                                                               rel=1e-9)


def test_an_fp8_dispatch_step_is_compute_plus_casts_plus_collectives():
    link, h100 = LINKS["nvlink4"], DEVICES["h100"]
    bf16 = tp_prefill_step(MIXTRAL, h100, link, [2048] * 4, ep=2)
    fp8 = tp_prefill_step(MIXTRAL, h100, link, [2048] * 4, ep=2, dispatch=place_dispatch("fp8"))
    assert fp8.compute_s == bf16.compute_s and bf16.cast_s == 0.0
    assert fp8.cast_s == pytest.approx(MIXTRAL.layers * gpu_cast_s(MIXTRAL, h100, 8192, 2))
    saved = bf16.alltoall_s - fp8.alltoall_s
    assert saved == pytest.approx(MIXTRAL.layers * 33_554_432 * (2 - 1.0625) / link.bandwidth_Bps)
    assert fp8.total_s == pytest.approx(fp8.compute_s + fp8.cast_s + fp8.collective_s)


def test_fp8_in_transit_is_refused_by_the_module_or_moved_to_the_gpu_by_policy():
    with pytest.raises(ConfigError, match=r"FP8 dispatch refused in transit: it needs rounding.*--dispatch-at gpu"):
        place_dispatch("fp8", "transit")
    moved = place_dispatch("fp8", "transit", policy=Policy.HOST)
    assert moved.runs_at == "gpu" and "policy host" in moved.why and moved.budget is not None
    assert place_dispatch("fp8", "gpu").runs_at == "gpu"
    assert place_dispatch("bf16", "transit").runs_at == "-"


def test_a_dispatch_codec_needs_an_all_to_all_and_a_known_name():
    with pytest.raises(ConfigError, match="needs an all-to-all"):
        tp_decode_step(MODELS["llama3-70b"], DEVICES["h100"], LINKS["nvlink4"], tp=4, dispatch=place_dispatch("fp8"))
    with pytest.raises(ConfigError, match=r"unknown dispatch codec 'fp4' \(choose from: bf16, fp8\)"):
        place_dispatch("fp4")
    with pytest.raises(ConfigError, match=r"unknown dispatch placement 'nic'"):
        place_dispatch("fp8", "nic")
