"""The twin's run: the agents' decisions on a virtual clock (twin/serving.py)."""

from __future__ import annotations

import numpy as np
import pytest
from ml_dtypes import bfloat16

from kvtransit.agents.common import kv_frames
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.slo import summarise
from kvtransit.model.scenario import Scenario
from kvtransit.twin.link import WireSizer
from kvtransit.twin.serving import run_twin


def _scenario(**values) -> Scenario:
    return Scenario.build(**{"requests": 120, "rate": 6.0, **values})


def test_the_same_scenario_gives_the_same_requests_the_same_figures():
    a, b = run_twin(_scenario()), run_twin(_scenario())
    assert [r.token_times_s for r in a.records] == [r.token_times_s for r in b.records]
    assert [r.request_id for r in a.records] == list(range(120))


def test_every_request_ends_with_all_its_tokens_in_order_and_its_kv_before_its_second():
    run = run_twin(_scenario())
    for r in run.records:
        assert r.finished and len(r.token_times_s) == r.output_tokens
        assert r.token_times_s == sorted(r.token_times_s)
        assert r.arrival_s <= r.token_times_s[0]
        if r.output_tokens > 1:
            assert r.token_times_s[0] <= r.kv_ready_s <= r.token_times_s[1]
            assert r.decode_wait_s is not None and r.decode_wait_s >= 0


def test_a_lone_request_takes_the_roofline_step_then_the_prescribed_handoff():
    """One request on an idle system: TTFT is its prefill step, the hand-off latency + wire / bandwidth exactly."""
    from kvtransit.model.judge.fidelity import prescribed_handoff_s
    from kvtransit.model.serving.prefill_plan import BatchEntry, plan_prefill_step

    scenario = _scenario(requests=1, codec="none", prompt_cv=0.0, output_cv=0.0)
    record = run_twin(scenario).records[0]
    step = plan_prefill_step(scenario, [BatchEntry(0, 2048, 256)])
    assert record.ttft_s == pytest.approx(step.model_s)
    kv = scenario.model_spec.kv_bytes(2048)
    assert record.handoff_s == pytest.approx(prescribed_handoff_s(scenario, kv, kv))


@pytest.mark.parametrize("codec", ["fp8", "freq-keep-k", "fp4-block", "kivi-2", "kivi-3"])
@pytest.mark.parametrize("tokens", [37, 1000, 2048])
def test_the_wire_bytes_are_what_the_encoder_makes_of_a_whole_full_size_layer(codec, tokens):
    """A K and a V row size the wire; a whole layer at full size, encoded as the prefill cuts it (rows of whole token
    sequences in pieces of at most 8 MiB, agents/common/kv_frames.py), has the same ratio of wire to KV bytes."""
    scenario = _scenario(codec=codec, scale=1.0)
    layout = scenario.kv_layout
    rows = kv_frames.as_rows(np.random.default_rng(1).standard_normal(layout.layer_shape(tokens))
                             .astype(np.float32).astype(bfloat16))
    codec_obj = kv_frames.codec_for(scenario, tokens)
    pieces = kv_frames.row_slices(1, rows.shape[0], rows.shape[1] * rows.shape[2] * 2)
    encoded = sum(codec_obj.encode(rows[p.start:p.stop]).wire_bytes for p in pieces)
    assert WireSizer(scenario).wire_bytes(float(rows.nbytes), tokens) == pytest.approx(encoded, rel=1e-3)


def test_max_concurrency_holds_requests_until_a_slot_frees():
    run = run_twin(_scenario(max_concurrency=2, rate=50.0, requests=20))
    spans = [(r.arrival_s, r.token_times_s[-1]) for r in run.records]
    for t, _ in spans:
        assert sum(1 for a, f in spans if a <= t < f) <= 2


def test_layerwise_release_hides_part_of_the_handoff_behind_the_prefill():
    whole = summarise(run_twin(_scenario(codec="none")).records)
    layerwise = summarise(run_twin(_scenario(codec="none", handoff="layerwise")).records)
    assert layerwise.handoff_s["p50"] < whole.handoff_s["p50"]


def test_chunked_prefill_and_more_instances_and_lanes_still_account_for_every_request():
    run = run_twin(_scenario(prefill_chunk=512, prefill=2, decode=2, channels=2, rate=12.0))
    assert all(r.finished for r in run.records)
    assert min(run.prefill_steps) > 0 and min(run.decode_steps) > 0
    assert {s.lane for s in run.stages.values()} == {0, 1}


def test_a_request_that_can_never_fit_decode_fails_with_the_live_reason():
    # llama3-70b on 2 H100s holds 8,835 tokens of KV beside its weights; 8,000 + 4,000 never fit.
    scenario = _scenario(model="llama3-70b", gpus=2, requests=3, prompt_mean=8000, prompt_cv=0.0, output_mean=4000,
                         output_cv=0.0, codec="none")
    run = run_twin(scenario)
    assert all(r.failure == "kv does not fit decode" for r in run.records)


@pytest.mark.parametrize("flags, flow", [({"kv_pool": "pool"}, "tier"),
                                         ({"kv_pool": "pool", "kv_placement": "remote"}, "selection")])
def test_a_flow_without_a_model_is_refused_by_name(flags, flow):
    with pytest.raises(ConfigError, match=f"twin: no model yet for flow .*{flow}: "):
        run_twin(_scenario(**flags))


def test_a_tp_group_and_a_ring_run_as_their_sections_plan_them():
    tp = run_twin(_scenario(decode_tp=2, requests=30))
    assert all(r.finished for r in tp.records)
    ring = run_twin(_scenario(ring_share=0.1, requests=30))
    assert all(r.finished for r in ring.records)

