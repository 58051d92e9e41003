"""The roofline of docs/reference.md §3, pinned to its closed-form checks, and its monotonicity."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.cost.energy import gpu_energy_j, link_energy_j, module_energy_j
from kvtransit.model.cost.roofline import (
    decode_step_s,
    decode_work,
    kv_capacity_tokens,
    prefill_step_s,
    prefill_work,
    step_energy_j,
)
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Module

H100 = DEVICES["h100"]
L8B, L70B = MODELS["llama3-8b"], MODELS["llama3-70b"]


def test_closed_form_checks_of_reference_section_3():
    assert f"{decode_step_s(L8B, H100, 1, 1, 2048) * 1e3:.3f}" == "6.201"
    assert f"{decode_step_s(L8B, H100, 1, 64, 64 * 2048) * 1e3:.3f}" == "12.514"
    assert f"{prefill_step_s(L8B, H100, 1, [2048]) * 1e3:.3f}" == "59.033"
    assert f"{decode_step_s(L70B, H100, 4, 16, 16 * 2300) * 1e3:.3f}" == "14.592"
    assert f"{prefill_step_s(L70B, H100, 4, [2048]) * 1e3:.3f}" == "133.867"


def test_prefill_work_adds_attention_per_prompt_not_over_the_batch_total():
    one = prefill_work(L8B, [2048])
    two = prefill_work(L8B, [1024, 1024])
    # Same token count, same weights and KV bytes; attention is quadratic per prompt, so two halves cost less.
    assert one.hbm_bytes == two.hbm_bytes
    assert one.flops - two.flops == 2 * L8B.layers * L8B.d_model * (2048 * 2049 - 2 * 1024 * 1025)


def test_kv_capacity_formula():
    expected = int((80e9 * 0.9 - L8B.resident_weight_bytes) // L8B.kv_bytes_per_token)
    assert kv_capacity_tokens(L8B, H100, 1) == expected
    assert kv_capacity_tokens(L70B, H100, 1) == 0  # 141 GB of weights do not fit in 72 GB


def test_energy_formulas():
    work = decode_work(L8B, 1, 2048)
    assert step_energy_j(H100, work) == pytest.approx(work.flops * 1.0e-12 + work.hbm_bytes * 60e-12)
    assert gpu_energy_j(H100, 1e12, 0) == pytest.approx(1.0)
    assert link_energy_j(LINKS["nvlink4"], 1e9) == pytest.approx(8e9 * 5e-12)
    assert module_energy_j(Module(), 1e9) == pytest.approx(8e9 * 1e-12)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: decode_step_s(L8B, H100, 0, 1, 10), "number of GPUs"),
        (lambda: decode_step_s(L8B, H100, 1, 0, 10), "decode batch"),
        (lambda: decode_step_s(L8B, H100, 1, 1, -1), "context tokens"),
        (lambda: prefill_step_s(L8B, H100, 1, []), "at least one prompt"),
        (lambda: prefill_step_s(L8B, H100, 1, [0]), "prompt length"),
    ],
)
def test_bad_step_inputs_are_config_errors(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


@given(batch=st.integers(1, 512), extra=st.integers(1, 64), ctx=st.integers(0, 500_000),
       gpus=st.integers(1, 8), device=st.sampled_from(sorted(DEVICES)))
def test_decode_step_time_never_falls_as_batch_or_context_grows(batch, extra, ctx, gpus, device):
    d = DEVICES[device]
    base = decode_step_s(L8B, d, gpus, batch, ctx)
    assert decode_step_s(L8B, d, gpus, batch + extra, ctx) >= base
    assert decode_step_s(L8B, d, gpus, batch, ctx + extra) >= base
    assert base >= 0.5e-3


@given(prompts=st.lists(st.integers(1, 8192), min_size=1, max_size=8), extra=st.integers(1, 4096))
def test_prefill_step_time_never_falls_when_a_prompt_grows(prompts, extra):
    longer = [prompts[0] + extra, *prompts[1:]]
    assert prefill_step_s(L8B, H100, 1, longer) >= prefill_step_s(L8B, H100, 1, prompts)
