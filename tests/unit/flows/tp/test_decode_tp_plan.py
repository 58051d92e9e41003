"""A decode instance as a TP group (model/serving/decode_plan.py): its step is the shard's roofline
plus the 2·L all-reduces of docs/reference.md §7, of which one real all-reduce a step carries every byte and the rest is
held; the scenario's fields and their one-line errors; the collective check of the fidelity guard."""

from __future__ import annotations

import math

import pytest

from kvtransit.flows.tp.model import ring_allreduce_s, switch_allreduce, tp_decode_step
from kvtransit.flows.tp.section import TpSection
from kvtransit.model.cost.roofline import decode_step_s
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import COLLECTIVE_SHARE_TOLERANCE, NOT_MEASURED, collective_gap
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.decode_plan import plan_decode_step


def test_without_a_group_the_step_is_the_roofline_on_its_gpus_as_before():
    s = Scenario(gpus=2)
    plan = plan_decode_step(s, 8, 8 * 2300)
    assert plan.model_s == pytest.approx(decode_step_s(s.model_spec, s.device_spec, 2, 8, 8 * 2300))
    assert plan.collective_s == 0 and plan.extra is None and plan.compute_s == plan.model_s


@pytest.mark.parametrize("allreduce", ["ring", "switch"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_tp_step_is_the_shard_roofline_plus_two_allreduces_a_layer(allreduce, tp):
    s = Scenario.build(decode_tp=tp, allreduce=allreduce, scale=1 / 64)
    model, link = s.model_spec, TpSection.of(s).link_spec
    batch = 8
    plan = plan_decode_step(s, batch, batch * 2300)
    nbytes = batch * model.d_model * 2  # S = tokens × d × 2 B
    each = (ring_allreduce_s(nbytes, tp, link) if allreduce == "ring"
            else switch_allreduce(nbytes, tp, link, s.module).total_s)
    assert plan.collective_s == pytest.approx(2 * model.layers * each)
    assert plan.compute_s == pytest.approx(decode_step_s(model, s.device_spec, tp, batch, batch * 2300))
    assert plan.model_s == pytest.approx(tp_decode_step(model, s.device_spec, link, tp=tp, batch=batch,
                                                        context_total=batch * 2300, allreduce=allreduce,
                                                        module=s.module).total_s)


def test_one_real_allreduce_carries_every_bytes_of_the_step_at_scale_and_the_rest_is_held():
    s = Scenario(decode_tp=4, scale=1 / 64)
    model, link = s.model_spec, TpSection.of(s).link_spec
    plan = plan_decode_step(s, 8, 8 * 2300)
    group = plan.extra
    assert group is not None
    values = 2 * model.layers * 8 * model.d_model * s.effective_scale
    assert group.values % 4 == 0 and values <= group.values < values + 4
    # The real one: all 2·L all-reduces' bytes with one set of 2(n − 1) latencies; held: the other 2·L − 1 sets.
    assert group.real_model_s == pytest.approx(ring_allreduce_s(2 * model.layers * 8 * model.d_model * 2, 4, link))
    assert group.held_s == pytest.approx((2 * model.layers - 1) * 2 * 3 * link.latency_s)
    assert group.real_model_s + group.held_s == pytest.approx(plan.collective_s)


def test_a_switch_group_holds_the_other_allreduces_hops_and_module_latency():
    s = Scenario.build(decode_tp=4, allreduce="switch", scale=1 / 64)
    link = TpSection.of(s).link_spec
    group = plan_decode_step(s, 1, 2300).extra
    assert group is not None
    assert group.held_s == pytest.approx((2 * s.model_spec.layers - 1) * (2 * link.latency_s
                                                                          + s.module.added_latency_s))


def test_a_group_decodes_on_its_own_gpus_kv_capacity():
    s = Scenario(model="llama3-70b", gpus=2, decode_tp=4)
    assert s.decode_gpus == 4 and s.decode_kv_capacity_tokens > s.kv_capacity_tokens


def test_the_scaleup_link_is_scaled_and_dilated_as_the_kv_link_is():
    s = Scenario.build(decode_tp=2, scale=1 / 64, dilation=5, scaleup_link="nvlink5")
    scaled = TpSection.of(s).scaled_link(s)
    assert scaled.bandwidth_Bps == pytest.approx(900e9 * s.effective_scale / 5)
    assert scaled.latency_s == pytest.approx(5e-6 * 5)


@pytest.mark.parametrize("fields, message", [
    ({"decode_tp": 3}, "decode_tp: TP 3 does not divide llama3-8b's 32 heads (valid: 1, 2, 4, 8, 16, 32)"),
    ({"decode_tp": 0}, "decode_tp: must be >= 1"),
    ({"decode_tp": 2, "allreduce": "tree"}, "allreduce: unknown value 'tree' (choose from: ring, switch)"),
    ({"decode_tp": 2, "scaleup_link": "pcie9"}, "scaleup_link: unknown link 'pcie9'"),
])
def test_a_bad_group_is_one_line_naming_the_field_and_the_valid_values(fields, message):
    with pytest.raises(ConfigError) as err:
        Scenario.build(**fields)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_collective_check_passes_within_three_points_and_fails_closed():
    assert collective_gap(0.50, 0.49, 1.0).ok
    gap = collective_gap(0.60, 0.49, 1.0)
    assert not gap.ok and gap.target == COLLECTIVE_SHARE_TOLERANCE and "try --dilation" in gap.hint
    for unmeasured in (collective_gap(None, 0.4, 1.0), collective_gap(math.nan, 0.4, 1.0),
                       collective_gap(0.4, 0.4, 1.0, failure="rank 1 is gone")):
        assert not unmeasured.ok and unmeasured.hint.startswith(NOT_MEASURED)


def test_an_ep_group_holds_l_allreduces_and_l_alltoalls_and_carries_one_of_each_for_real():
    s = Scenario.build(model="mixtral-8x7b", gpus=2, decode_tp=2, decode_ep=True, scale=1 / 64)
    model, link = s.model_spec, TpSection.of(s).link_spec
    plan = plan_decode_step(s, 8, 8 * 2300)
    step = tp_decode_step(model, s.device_spec, link, ep=2, batch=8, context_total=8 * 2300)
    assert (step.allreduces, step.alltoalls) == (model.layers, model.layers)
    assert plan.collective_s == pytest.approx(step.collective_s) and plan.model_s == pytest.approx(step.total_s)
    group = plan.extra
    assert group is not None
    # One real all-reduce of L all-reduces' values, one real all-to-all of L layers' dispatch + combine: a ring hop
    # carries 1/n of the tokens' k activations of every layer.
    assert group.values >= model.layers * 8 * model.d_model * s.effective_scale
    assert group.alltoall_values == pytest.approx(model.layers * 8 * model.experts_active * model.d_model / 2
                                                  * s.effective_scale, abs=1)
    real = (ring_allreduce_s(model.layers * 8 * model.d_model * 2, 2, link)
            + link.serialisation_s(model.layers * step.alltoall_bytes) + 2 * link.latency_s)
    assert group.real_model_s == pytest.approx(real)
    assert group.real_model_s + group.held_s == pytest.approx(plan.collective_s)


@pytest.mark.parametrize("fields, message", [
    ({"decode_ep": True}, "decode_ep: expert parallelism needs a decode group: give --decode-tp N"),
    ({"decode_tp": 2, "decode_ep": True},
     "decode_ep: expert parallelism needs a mixture-of-experts model; llama3-8b is dense (valid models: mixtral-8x7b)"),
    ({"model": "mixtral-8x7b", "gpus": 2, "decode_tp": 2, "decode_ep": True, "allreduce": "switch"},
     "decode_ep: the all-to-all goes between the ranks, a ring: --allreduce ring (valid: ring)"),
    ({"model": "mixtral-8x7b", "gpus": 2, "decode_tp": 16, "decode_ep": True}, "decode_ep: EP 16 does not divide"),
])
def test_a_bad_ep_group_is_one_line_with_the_valid_values(fields, message):
    with pytest.raises(ConfigError) as err:
        Scenario.build(**fields)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_tp_prefill_step_reduces_every_token_it_computes():
    from kvtransit.flows.tp.model import activation_bytes
    from kvtransit.model.cost.roofline import prefill_step_cached_s
    from kvtransit.model.serving.prefill_plan import BatchEntry, plan_prefill_step

    s = Scenario(prefill_tp=4, scale=1 / 256)
    model, link = s.model_spec, TpSection.of(s).link_spec
    entries = [BatchEntry(0, 2048, 64), BatchEntry(1, 1024, 64, cached_tokens=512)]
    plan = plan_prefill_step(s, entries)
    computed = 2048 + 512
    assert plan.compute_s == pytest.approx(prefill_step_cached_s(model, s.device_spec, 4, [(2048, 0), (1024, 512)]))
    assert plan.collective_s == pytest.approx(2 * model.layers * ring_allreduce_s(activation_bytes(model, computed),
                                                                                  4, link))
    group = plan.extra
    assert group is not None and group.values % 4 == 0
    assert group.values == pytest.approx(2 * model.layers * computed * model.d_model * s.effective_scale, abs=4)
    assert plan_decode_step(Scenario(prefill_tp=4), 1, 2048).extra is None  # the decode is one GPU still


def test_a_prefill_group_that_does_not_divide_the_heads_is_one_line():
    with pytest.raises(ConfigError, match=r"prefill_tp: TP 6 does not divide llama3-8b's 32 heads \(valid: "):
        Scenario(prefill_tp=6)
