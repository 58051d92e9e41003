"""What a live collective run holds and sends (flows/tp/run.py: plan_collective), before any process
starts: the modelled step is kept whatever the granularity, scale and dilation; bad groups are one line."""

from __future__ import annotations

import pytest

from kvtransit.flows.tp.model import ring_allreduce_s, switch_allreduce
from kvtransit.flows.tp.run import plan_collective
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.errors import ConfigError

LLAMA70, MIXTRAL, H100, NVLINK4 = MODELS["llama3-70b"], MODELS["mixtral-8x7b"], DEVICES["h100"], LINKS["nvlink4"]


def _emulated_step_s(plan) -> float:
    """The step the ranks hold at dilation 1: compute + the real collectives' modelled time + what is held."""
    n, link = plan.n, plan.link
    s_real = plan.values * 2 / plan.effective_scale  # model bytes in one real all-reduce
    one = ring_allreduce_s(s_real, n, link) if plan.allreduce == "ring" else switch_allreduce(s_real, n, link).total_s
    return (plan.compute_s + plan.held_s) / plan.dilation + plan.collectives * one


@pytest.mark.parametrize("allreduce", ["ring", "switch"])
@pytest.mark.parametrize("granularity", ["layer", "step"])
def test_either_granularity_holds_the_modelled_step(allreduce, granularity):
    plan = plan_collective(LLAMA70, H100, NVLINK4, tp=4, allreduce=allreduce, granularity=granularity, dilation=10)
    assert _emulated_step_s(plan) == pytest.approx(plan.modelled.total_s, rel=1e-9)
    assert plan.collectives == (160 if granularity == "layer" else 1)
    assert plan.compute_s == pytest.approx(plan.modelled.compute_s * 10)


def test_scale_shrinks_the_bytes_and_the_rate_alike_and_dilation_divides_the_rate():
    plan = plan_collective(LLAMA70, H100, NVLINK4, tp=4, allreduce="ring", scale=0.01, dilation=10,
                           granularity="layer")
    assert plan.values % 4 == 0 and plan.values == 84  # ceil(8192 × 0.01 / 4) × 4
    assert plan.effective_scale == pytest.approx(84 / 8192)
    assert plan.rate_Bps == pytest.approx(450e9 * 84 / 8192 / 10)
    assert plan.latency_s == pytest.approx(50e-6)


def test_auto_granularity_is_per_layer_only_when_a_hop_outlasts_the_hosts_cost():
    slow = plan_collective(LLAMA70, H100, NVLINK4, tp=2, allreduce="ring", dilation=200, cores=2)
    fast = plan_collective(LLAMA70, H100, NVLINK4, tp=2, allreduce="ring", dilation=1, cores=2)
    assert (slow.granularity, fast.granularity) == ("layer", "step")
    assert "per-layer messages could not keep up" in fast.why


def test_ep_prefill_plans_an_alltoall_beside_the_attention_allreduce():
    plan = plan_collective(MIXTRAL, H100, NVLINK4, ep=2, prompts=[2048] * 4, scale=0.001, granularity="layer")
    assert (plan.collectives, plan.step_kind, plan.tokens) == (32, "prefill", 8192)
    assert plan.alltoall_values == round(8192 * 2 * 4096 / 2 * plan.effective_scale)
    assert plan.rank_plan(0)["per_layer"] == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"tp": 3}, "TP 3 does not divide llama3-70b's 64 heads (valid: 1, 2, 4, 8, 16, 32, 64)"),
    ({"tp": 1}, "a collective needs a group of at least 2"),
    ({"ep": 2}, "EP needs a mixture-of-experts model; llama3-70b is dense"),
    ({"tp": 64, "cores": 2}, "a group of 64 needs 64 processes; this host has 2 cores (valid: a group of up to 8)"),
    ({"tp": 4, "allreduce": "tree"}, "unknown all-reduce 'tree' (choose from: ring, switch)"),
])
def test_bad_groups_are_one_line_with_the_valid_values(kwargs, message):
    with pytest.raises(ConfigError) as info:
        plan_collective(LLAMA70, H100, NVLINK4, **kwargs)
    assert message in str(info.value)
