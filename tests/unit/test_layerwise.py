"""Layer-wise KV streaming as pure data (model/serving/layerwise.py): when each layer is released, how a hand-off splits
at its first token, and the model of its exposed part; the scenario's bad input; chunked prefill's batches."""

from __future__ import annotations

import argparse

import pytest

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.harness.studies.sweep.plan import preset
from kvtransit.harness.studies.sweep.runner import sweep_points
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import prescribed_exposed_s, prescribed_handoff_s, prescribed_latency_s
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import (
    HandoffSplit,
    chunk_stops,
    kv_segments,
    layerwise_exposed_s,
    link_was_free,
    prefill_overlap_s,
    release_ns,
    streamed_ready_s,
)
from kvtransit.model.serving.policies import PrefillQueue, ServingRequest
from kvtransit.model.serving.prefill_plan import BatchEntry, ChunkedPrefillQueue, plan_prefill_step

STEP_START_NS, STEP_NS, LAYERS = 10**12, 32_000_000, 32


# --- release times ------------------------------------------------------------------------------------------------

def test_layerwise_layers_are_released_as_their_compute_ends_and_the_last_at_the_first_token():
    times = [release_ns("layerwise", STEP_START_NS, STEP_NS, layer, LAYERS) for layer in range(LAYERS)]
    assert times[0] == STEP_START_NS + STEP_NS // LAYERS
    assert times == [STEP_START_NS + (layer + 1) * STEP_NS // LAYERS for layer in range(LAYERS)]
    assert times[-1] == STEP_START_NS + STEP_NS  # the step's end: the first token
    assert times == sorted(set(times))


def test_whole_mode_releases_every_layer_at_the_steps_end():
    assert {release_ns("whole", STEP_START_NS, STEP_NS, layer, LAYERS) for layer in range(LAYERS)} == {
        STEP_START_NS + STEP_NS}


@pytest.mark.parametrize("mode,layer", [("perlayer", 0), ("layerwise", 32), ("layerwise", -1)])
def test_a_release_of_a_bad_mode_or_layer_is_refused(mode, layer):
    with pytest.raises(ConfigError):
        release_ns(mode, STEP_START_NS, STEP_NS, layer, LAYERS)


# --- the split at the first token -------------------------------------------------------------------------------

@pytest.mark.parametrize("first_token,first_bytes,ready,exposed,hidden,span", [
    (100, 20, 130, 30, 80, 110),  # layer-wise: most of it crossed during the step; span = first bytes → ready
    (100, 105, 160, 60, 0, 60),  # whole: nothing crosses before the first token; span = first token → ready
    (100, 20, 95, 0, 75, 75),  # KV ready before the first token's (late) stamp: nothing exposed, never negative
])
def test_exposed_and_hidden_add_up_to_the_hand_offs_span(first_token, first_bytes, ready, exposed, hidden, span):
    split = HandoffSplit.from_stamps(first_token_ns=first_token, first_bytes_ns=first_bytes, ready_ns=ready,
                                     hidden_bytes=3, total_bytes=10, seconds_per_ns=1.0)
    assert (split.exposed_s, split.hidden_s) == (exposed, hidden)
    assert split.total_s == span


def test_hidden_bytes_must_be_a_part_of_the_bytes():
    with pytest.raises(ConfigError, match="hidden bytes 11"):
        HandoffSplit.from_stamps(first_token_ns=1, first_bytes_ns=0, ready_ns=2, hidden_bytes=11, total_bytes=10)


# --- the model of the exposed part -------------------------------------------------------------------------------

def _layerwise_parts(step_s: float, serialise_s: float, layers: int) -> list[tuple[float, float]]:
    """Equal layers released every step/L, times relative to the first token (the last layer's release)."""
    return [((layer + 1) * step_s / layers - step_s, serialise_s / layers) for layer in range(layers)]


@pytest.mark.parametrize("step_s,serialise_s", [(0.059, 0.0859), (0.059, 0.0215), (0.010, 0.010), (0.2, 0.001)])
def test_the_layerwise_formula_is_the_fifo_link_over_the_layers_release_times(step_s, serialise_s):
    latency_s = 20e-6
    formula = layerwise_exposed_s(latency_s + serialise_s, prefill_overlap_s(step_s, serialise_s, LAYERS))
    assert formula == pytest.approx(streamed_ready_s(_layerwise_parts(step_s, serialise_s, LAYERS), latency_s))
    assert formula >= latency_s + serialise_s / LAYERS - 1e-12  # the last layer is always exposed


def test_one_layer_or_whole_mode_hides_nothing():
    assert prefill_overlap_s(0.05, 0.08, 1) == 0.0
    assert streamed_ready_s([(0.0, 0.08)], 2e-5) == pytest.approx(0.08 + 2e-5)


def test_the_fidelity_model_reads_the_step_off_the_first_layers_release():
    """One step of a layer-wise hand-off (model units): the step is what the first release says, and the model is
    the formula; a chunked one's actual release times give the same on the same schedule."""
    scenario = Scenario(codec="none", handoff="layerwise")
    step_s, kv = 0.059, float(scenario.model_spec.kv_bytes(2048))
    layers = scenario.model_spec.layers
    chunks = [((layer + 1) * step_s / layers - step_s, kv / layers, kv / layers) for layer in range(layers)]
    transfer = prescribed_handoff_s(scenario, kv, kv)
    expected = layerwise_exposed_s(transfer, prefill_overlap_s(step_s, transfer - prescribed_latency_s(scenario),
                                                               layers))
    assert prescribed_exposed_s(scenario, chunks, layers) == pytest.approx(expected)
    chunked = Scenario(codec="none", handoff="layerwise", prefill_chunk=4096)  # one chunk: the same schedule
    assert prescribed_exposed_s(chunked, chunks, layers) == pytest.approx(expected)
    # 2,048 tokens on eth-25g take 85.9 ms (docs/reference.md §2), a 59 ms step hides (31/32) of 59 ms of it.
    assert expected == pytest.approx(0.08592 - 31 / 32 * 0.059, abs=1e-4)


def test_a_hand_off_behind_another_still_in_flight_did_not_find_the_link_free():
    earlier = [(0, 100), (50, 120)]
    assert not link_was_free(60, earlier)
    assert link_was_free(130, earlier)
    assert not link_was_free(50, [(50, 60)])  # same step, released together: the earlier one goes first
    assert link_was_free(60, earlier, channels=3)


# --- chunked prefill -------------------------------------------------------------------------------------------

def test_chunk_stops_cut_the_computed_tokens_and_a_cached_prefix_goes_with_the_first():
    assert chunk_stops(2048, 0, 0) == (2048,)
    assert chunk_stops(2048, 0, 512) == (512, 1024, 1536, 2048)
    assert chunk_stops(2000, 512, 1024) == (1536, 2000)


def test_a_last_chunk_too_short_for_the_codecs_sinks_goes_with_the_one_before():
    assert kv_segments((512, 1024, 1026), 4) == (512, 1026)
    assert kv_segments((512, 1024, 1030), 4) == (512, 1024, 1030)
    assert kv_segments((3,), 4) == (3,)


def test_chunked_prefill_takes_one_chunk_of_each_request_a_step_in_fifo_order_within_the_budget():
    queue = ChunkedPrefillQueue(1024, token_limit=2048)
    for rid, prompt in ((1, 3000), (2, 500), (3, 2000)):
        queue.push(ServingRequest(rid, prompt, 8))
    steps = []
    while len(queue):
        steps.append([(c.request.request_id, c.start, c.stop) for c in queue.take_batch()])
    assert steps == [[(1, 0, 1024), (2, 0, 500)],  # request 3's chunk would overflow 2,048: strict FIFO stops
                     [(1, 1024, 2048), (3, 0, 1024)],
                     [(1, 2048, 3000), (3, 1024, 2000)]]
    assert queue.queued_tokens == 0


def test_prompts_within_one_chunk_batch_as_without_chunking():
    whole, chunked = PrefillQueue(), ChunkedPrefillQueue(4096)
    for rid, prompt in enumerate((1000, 3000, 4000, 2500, 700)):
        whole.push(ServingRequest(rid, prompt, 8))
        chunked.push(ServingRequest(rid, prompt, 8))
    while len(whole):
        assert [r.request_id for r in whole.take_batch()] == [c.request.request_id for c in chunked.take_batch()]
    assert not len(chunked)


def test_a_later_chunk_reads_its_earlier_chunks_back_as_context_and_adds_only_its_own_kv():
    scenario = Scenario(codec="freq-keep-k", compress_at="gpu")
    first = BatchEntry(1, 1024, 8, 0, first_chunk=True, last_chunk=False)
    later = BatchEntry(1, 2048, 8, 1024, first_chunk=False, last_chunk=True)
    assert (first.kv_tokens, later.kv_tokens) == (1024, 1024)
    whole = plan_prefill_step(scenario, [BatchEntry(1, 2048, 8)])
    # The two chunks compute what one step would, the later one re-reading the first's KV (a longer step).
    assert plan_prefill_step(scenario, [first]).model_s + plan_prefill_step(scenario, [later]).model_s > whole.model_s


# --- bad input --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields,match", [
    ({"handoff": "perlayer"}, r"handoff: unknown value 'perlayer' \(choose from: whole, layerwise\)"),
    ({"prefill_chunk": 100}, r"prefill_chunk: 100 tokens is outside 512\.\.8192"),
    ({"prefill_chunk": 8193}, r"prefill_chunk: 8193 tokens is outside 512\.\.8192"),
    ({"prefill_chunk": 600.5}, r"prefill_chunk: expected a whole number"),
    ({"prefill_chunk": 512, "sinks": 600}, r"fewer than the 600 sink tokens freq-keep-k keeps exact"),
])
def test_a_bad_hand_off_mode_or_chunk_is_one_line_naming_the_field_and_the_valid_range(fields, match):
    with pytest.raises(ConfigError, match=match) as info:
        Scenario.build(**fields)
    assert "\n" not in str(info.value)


def test_the_flags_give_the_same_scenario_to_every_process():
    parser = argparse.ArgumentParser()
    add_scenario_args(parser)
    scenario = scenario_from_args(parser.parse_args(["--handoff", "layerwise", "--prefill-chunk", "2048"]))
    assert (scenario.handoff, scenario.prefill_chunk) == ("layerwise", 2048)
    argv = scenario.to_argv()
    assert argv[argv.index("--handoff") + 1] == "layerwise" and argv[argv.index("--prefill-chunk") + 1] == "2048"
    assert scenario_from_args(parser.parse_args(argv)) == scenario
    assert Scenario() == Scenario(handoff="whole", prefill_chunk=0)  # the reference model's, by default
    with pytest.raises(ConfigError, match=r"prefill_chunk: 64 tokens is outside 512\.\.8192"):
        scenario_from_args(parser.parse_args(["--prefill-chunk", "64"]))


def test_the_layerwise_preset_reruns_the_25g_load_study_whole_and_layerwise():
    points = sweep_points(preset("handoff-layerwise-25g"))
    scenarios = [s for _, s in points]
    assert len(points) == 4 * 2 * 2 and len({key for key, _ in points}) == len(points)
    assert {(s.rate, s.codec, s.handoff) for s in scenarios} == {
        (rate, codec, handoff) for rate in (8.0, 10.0, 12.0, 14.0) for codec in ("none", "freq-keep-k")
        for handoff in ("whole", "layerwise")}
    assert {(s.link, s.compress_at, s.prefill_chunk, s.requests) for s in scenarios} == {("eth-25g", "transit", 0, 800)}
    assert all(",handoff=" in key for key, _ in points)  # its whole points are not handoff-25g's rows
    # Layer-wise at dilation 3 (at 2 this box held its idle-link hand-offs 1.174x the model), whole at the preset's.
    assert {(s.handoff, s.dilation) for s in scenarios} == {("whole", 2.0), ("layerwise", 3.0)}
