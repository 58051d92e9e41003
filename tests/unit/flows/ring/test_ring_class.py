"""Ring attention inside `kvtransit up` (flows/ring/ring_class.py): the class rule, the model of a ring
request's prefill, the scenario's rules, the queue that keeps a ring request alone and the step plan it gets."""

from __future__ import annotations

import pytest

from kvtransit.flows.ring.blocks import SyntheticRingKV
from kvtransit.flows.ring.group import order_frame, rank_plan, read_order, ring_blocks
from kvtransit.flows.ring.model import hop
from kvtransit.flows.ring.ring_class import in_ring_class, rest_of_prompt_s, ring_prefill, with_ring_prompts
from kvtransit.flows.ring.section import RingSection
from kvtransit.flows.selection.remote_class import in_remote_class
from kvtransit.model.cost.roofline import STEP_OVERHEAD_S, StepWork, prefill_work_cached, step_energy_j, step_time
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.policies import PrefillQueue, ServingRequest
from kvtransit.model.serving.prefill_plan import BatchEntry, plan_prefill_step
from kvtransit.model.serving.workload import RequestSpec

RING = dict(ring_share=0.25, ring_ranks=4, ring_prompt=32768, codec="none")


def test_the_ring_class_is_a_fixed_share_of_the_ids_independent_of_the_remote_class():
    ids = range(20_000)
    ring = {i for i in ids if in_ring_class(7, i, 0.25)}
    remote = {i for i in ids if in_remote_class(7, i, 0.25)}
    assert len(ring) == pytest.approx(5_000, rel=0.05)
    assert len(ring & remote) == pytest.approx(1_250, rel=0.15)  # independent draws: a quarter of a quarter
    assert ring == {i for i in ids if in_ring_class(7, i, 0.25)}  # every process agrees
    assert not any(in_ring_class(7, i, 0.0) for i in ids) and all(in_ring_class(7, i, 1.0) for i in ids)


def test_a_ring_prefill_is_the_rest_of_the_prompt_then_l_layers_of_n_minus_1_overlapped_hops():
    scenario = Scenario.build(**RING, ring_link="eth-25g")
    model, device, link = scenario.model_spec, scenario.device_spec, RingSection.of(scenario).link_spec
    ring = ring_prefill(model, device, link, 4, 32768)
    one_hop = hop(model, device, link, 8192)
    assert ring.hop == one_hop and ring.hops_per_layer == 3 and ring.block_tokens == 8192
    assert ring.attention_s == pytest.approx(model.layers * (one_hop.compute_s + 3 * one_hop.total_s))
    assert ring.total_s == pytest.approx(ring.rest_s + ring.attention_s + STEP_OVERHEAD_S)
    assert RingSection.of(scenario).model(scenario) == ring


def test_the_rest_of_the_prompt_is_one_ranks_block_through_every_weight_on_the_roofline():
    scenario = Scenario(codec="none")
    model, device = scenario.model_spec, scenario.device_spec
    t = 8192
    work = StepWork(2.0 * model.matmul_params * t, float(model.weights_streamed_bytes + model.bytes_per_value * t
                                                         * model.d_model + t * model.kv_bytes_per_token))
    cost = step_time(work, device, 1)
    assert rest_of_prompt_s(model, device, t) == max(cost.compute_s, cost.memory_s)


def test_a_ring_of_more_gpus_prefills_the_deck_prompt_sooner_than_one_gpu_on_a_fast_link():
    one_gpu = plan_prefill_step(Scenario(codec="none"), [BatchEntry(1, 32768, 16)]).model_s
    for n in (2, 4, 8):
        ring = Scenario.build(**{**RING, "ring_ranks": n, "ring_link": "nvlink4"})
        assert ring.section(RingSection).model(ring).total_s < one_gpu


def test_only_the_ring_classs_requests_get_the_ring_prompt():
    specs = [RequestSpec(i, i * 0.1, 1000 + i, 16) for i in range(200)]
    out = with_ring_prompts(specs, 3, 0.3, 32768)
    for spec, new in zip(specs, out, strict=True):
        expected = 32768 if in_ring_class(3, spec.request_id, 0.3) else spec.prompt_tokens
        assert (new.request_id, new.arrival_s, new.output_tokens, new.prompt_tokens) == \
            (spec.request_id, spec.arrival_s, spec.output_tokens, expected)
    assert with_ring_prompts(specs, 3, 0.0, 32768) == specs


@pytest.mark.parametrize("fields, names", [
    ({"ring_ranks": 2}, ("ring_ranks", "ring-share")),
    ({"ring_share": 1.5}, ("ring_share", "<= 1")),
    ({**RING, "ring_ranks": 3}, ("ring_ranks", "2, 4, 8")),
    ({**RING, "ring_link": "pcie9"}, ("ring_link", "eth-100g")),
    ({**RING, "ring_prompt": 1002}, ("ring_prompt", "multiple of 4")),
    ({**RING, "ring_prompt": 2}, ("ring_prompt", ">= 4")),
    ({**RING, "ring_prompt": 4_000_000}, ("ring_prompt", "do not fit")),
    ({**RING, "prefill_tp": 2}, ("ring_share", "--prefill-tp 1")),
    ({**RING, "prefill_chunk": 512}, ("ring_share", "--prefill-chunk 0")),
    ({**RING, "handoff": "layerwise"}, ("ring_share", "--handoff whole")),
    ({**RING, "prefix_workload": "sessions"}, ("ring_share", "prefix workload")),
])
def test_bad_ring_settings_are_one_line_naming_the_field_and_the_valid_values(fields, names):
    with pytest.raises(ConfigError) as err:
        Scenario.build(**fields)
    message = str(err.value)
    assert "\n" not in message and all(name in message for name in names), message


def test_the_ring_link_is_shaped_at_the_rings_scale_and_the_runs_dilation():
    scenario = Scenario.build(**RING, scale=1 / 64, dilation=2.0)
    link, shaped = RingSection.of(scenario).link_spec, RingSection.of(scenario).scaled_link(scenario)
    assert shaped.bandwidth_Bps == pytest.approx(link.bandwidth_Bps * RingSection.of(scenario).scale(scenario) / 2)
    assert shaped.latency_s == pytest.approx(link.latency_s * 2)


@pytest.mark.parametrize("ring_link, dilation, channels", [
    ("eth-100g", 1.0, 1),  # 12.2 MB/s a channel, 4 ranks: one channel is 49 MB/s of the host's 50
    ("eth-100g", 8.0, 8),  # dilated 8x: eight fit
    ("eth-25g", 1.0, 4),  # 3.05 MB/s a channel: four
    ("eth-25g", 100.0, 16),  # never more than the run's own 16 (1/64)
    ("nvlink4", 1.0, 1),  # 879 MB/s a channel: one, and only dilation helps (the fidelity check says so)
])
def test_a_ring_blocks_channels_keep_its_ranks_within_the_hosts_budget(ring_link, dilation, channels):
    scenario = Scenario.build(**{**RING, "ring_link": ring_link}, scale=1 / 64, dilation=dilation)
    assert RingSection.of(scenario).layout(scenario).channels == channels
    assert RingSection.of(scenario).scale(scenario) == channels / scenario.model_spec.kv_dim


def test_a_ranks_blocks_carry_the_models_block_bytes_at_the_rings_scale():
    scenario = Scenario.build(**RING, scale=1 / 64, dilation=8.0)
    blocks = ring_blocks(scenario)
    model, layout = scenario.model_spec, RingSection.of(scenario).layout(scenario)
    assert blocks.block(1, 0).shape == (1, 2, layout.kv_heads, 8192, layout.head_dim)
    model_block = 8192 * 2 * model.kv_dim * model.bytes_per_value
    assert blocks.raw_bytes() == pytest.approx(model_block * RingSection.of(scenario).scale(scenario))
    assert (blocks.block(1, 0) == blocks.block(1, 0)).all() and not (blocks.block(1, 0) == blocks.block(2, 0)).all()
    plan = rank_plan(scenario, 0, 3)
    assert (plan.group, plan.rank, plan.size, plan.layers) == (2001, 3, 4, model.layers)
    assert plan.compute_s == pytest.approx(scenario.wall_s(RingSection.of(scenario).model(scenario).hop.compute_s))
    assert isinstance(blocks, SyntheticRingKV)


def test_an_order_says_which_prompt_and_when_it_starts():
    frame = order_frame(2001, 17, 123_456_789_012)
    assert (frame.group, frame.step, read_order(frame)) == (2001, 17, 123_456_789_012)


def test_a_ring_request_is_a_batch_of_its_own_and_no_batch_takes_it_behind_others():
    ring = {2, 3}
    queue = PrefillQueue(token_limit=100_000, runs_alone=lambda r: r.request_id in ring)
    for rid in range(6):
        queue.push(ServingRequest(rid, 1000, 16))
    assert [[r.request_id for r in queue.take_batch()] for _ in range(4)] == [[0, 1], [2], [3], [4, 5]]
    assert queue.queued_tokens == 0


def test_a_ring_requests_step_is_the_rings_plan_and_its_whole_prompts_energy():
    scenario = Scenario.build(**RING)
    rid = next(i for i in range(100) if RingSection.of(scenario).is_ring_request(scenario, i))
    plan = plan_prefill_step(scenario, [BatchEntry(rid, 32768, 16)])
    ring = RingSection.of(scenario).model(scenario)
    assert plan.extra == ring and plan.model_s == ring.total_s
    assert plan.wall_s == scenario.wall_s(plan.model_s)
    assert plan.energy_j == step_energy_j(scenario.device_spec, prefill_work_cached(scenario.model_spec,
                                                                                    [(32768, 0)]))
    other = next(i for i in range(100) if not RingSection.of(scenario).is_ring_request(scenario, i))
    assert plan_prefill_step(scenario, [BatchEntry(other, 1000, 16)]).extra is None
    with pytest.raises(ConfigError, match="a step of its own"):
        plan_prefill_step(scenario, [BatchEntry(rid, 32768, 16), BatchEntry(other, 1000, 16)])


def test_a_sweep_row_carries_the_rings_headline_figures():
    from kvtransit.flows.ring.report import REPORT

    _ring_columns = REPORT.columns

    block = {"ranks": 4, "link": "eth-25g", "attention_s": {"measured": 1.1, "model": 1.0},
             "ttft_ms": {"ring": {"p50": 1500.0}, "other": None}}
    assert _ring_columns({"ring": block}) == {
        "ring_ranks": 4, "ring_link": "eth-25g", "ring_attention_ms": 1100.0, "model_ring_attention_ms": 1000.0,
        "ring_ttft_p50_ms": 1500.0, "other_ttft_p50_ms": None}
    assert _ring_columns({"ring": None}) == {}


def test_a_ring_request_whose_prompt_is_not_the_rings_is_refused_by_its_step_plan():
    scenario = Scenario.build(**RING)
    rid = next(i for i in range(100) if RingSection.of(scenario).is_ring_request(scenario, i))
    with pytest.raises(ConfigError, match="ring_prompt"):
        plan_prefill_step(scenario, [BatchEntry(rid, 1000, 16)])


def test_the_testbeds_with_one_process_a_prefill_refuse_a_ring_class_with_the_way_to_run_it():
    from kvtransit.harness.deploy.k8s.scenario_configmap import refuse_host_files
    from kvtransit.harness.deploy.swarm.stack import refusal

    scenario = Scenario.build(**RING)
    with pytest.raises(ConfigError, match=r"ring-share.*kvtransit up"):
        refuse_host_files(scenario, "kubernetes")
    assert "kvtransit up" in (refusal(scenario) or "")


def test_the_offered_load_counts_a_ring_request_as_its_whole_ring_prefill():
    from kvtransit.model.serving.offered_load import offered_vs_capacity, prefill_share_s

    scenario = Scenario.build(**RING)
    specs = with_ring_prompts([RequestSpec(i, i * 0.5, 512, 16) for i in range(40)], scenario.seed, 0.25, 32768)
    ring = [s for s in specs if RingSection.of(scenario).is_ring_request(scenario, s.request_id)]
    busy = (len(ring) * RingSection.of(scenario).model(scenario).total_s
            + sum(prefill_share_s(scenario.model_spec, scenario.device_spec, 1, s.prompt_tokens)
                  for s in specs if s not in ring))
    check = offered_vs_capacity(scenario, specs)
    assert check.utilisation["prefill"] == pytest.approx(check.offered_rps * busy / len(specs))


def test_a_lossless_hop_forwards_the_very_bytes_a_decode_and_re_encode_would_make():
    """Why a rank with no codec and nothing to keep forwards a block as it came (flows/ring/rank.py)."""
    from kvtransit.flows.ring.blocks import LinkCodec

    codec = LinkCodec("none")
    block = ring_blocks(Scenario.build(**RING, scale=1 / 64, dilation=8.0)).block(2, 0)
    wire = codec.encode(block, 1)
    assert codec.encode(codec.decode(wire, block.shape), 2) == wire
