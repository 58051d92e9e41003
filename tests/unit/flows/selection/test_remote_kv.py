"""Remote KV with query-aware selection inside `kvtransit up`: the scenario's rules, the class
rule, the legs' bytes and model, the pool's content and the module's and host's arithmetic on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvtransit.flows.selection.remote_class import RemoteLegs, in_remote_class, leg_s, legs_model_s
from kvtransit.flows.selection.remote_context import (
    BF16,
    LegError,
    RemoteContexts,
    RemoteShapes,
    array_from,
    choose,
    pack_ids,
    score,
    step_queries,
    unpack_ids,
)
from kvtransit.flows.selection.section import SelectionSection
from kvtransit.kernels.selection import PageSummaries, page_summaries, top_k_pages
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario
from kvtransit.model.scenario_text import field_from_text

REMOTE = dict(kv_pool="pool", kv_placement="remote")


@pytest.mark.parametrize("fields, names", [
    (dict(select="top-k"), ("select:", "--kv-placement remote")),
    (dict(select_budget=0.25), ("select_budget:", "remote KV")),
    (dict(page_size=32), ("page_size:", "remote KV")),
    (dict(kv_placement="remote"), ("kv_placement:", "--kv-pool pool")),
    (dict(**REMOTE, page_size=24), ("page_size:", "valid page sizes: 1, 2, 4, 8, 16")),
    (dict(**REMOTE, select_budget=0.0), ("select_budget:", "(0, 1]")),
    (dict(**REMOTE, select_budget=1.5), ("select_budget:", "(0, 1]")),
    (dict(**REMOTE, select="some"), ("select:", "top-k, all")),
    (dict(**REMOTE, remote_share=0.0), ("remote_share",)),
    (dict(**REMOTE, remote_context=8), ("remote_context",)),
    (dict(**REMOTE, select_summary="minmax"), ("select_summary:", "--policy host")),
    (dict(**REMOTE, decode_tp=2), ("kv_placement:", "--decode-tp 1")),
])
def test_bad_remote_kv_settings_are_one_line_naming_the_field_and_the_valid_values(fields, names):
    with pytest.raises(ConfigError) as exc:
        Scenario.build(**fields)
    message = str(exc.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_quests_bound_runs_on_the_host_under_policy_host_and_the_mean_key_in_the_module():
    host = Scenario.build(**REMOTE, select_summary="minmax", policy="host")
    on_host = SelectionSection.of(host).scoring_check(host)
    assert on_host is not None and on_host.describe().endswith("-> host")
    assert SelectionSection.of(host).scoring_occupancy(host) == 0  # the module does not score it
    mean = Scenario.build(**REMOTE)
    in_module = SelectionSection.of(mean).scoring_check(mean)
    assert in_module is not None and in_module.fits
    low = Scenario.build(**REMOTE, module_budget="low")
    assert SelectionSection.of(low).scoring_occupancy(low) == pytest.approx(1.0 / 0.40)
    every = Scenario.build(**REMOTE, select="all")
    assert SelectionSection.of(every).scoring_check(every) is None


def test_a_budget_reads_as_the_deck_writes_it():
    assert field_from_text("select_budget", "1/16") == 1 / 16
    assert field_from_text("select_budget", "0.25") == 0.25
    with pytest.raises(ConfigError, match="select_budget"):
        field_from_text("select_budget", "1/0")


def test_the_remote_class_is_a_fixed_share_of_the_ids_agreed_by_every_process():
    picks = [in_remote_class(1, rid, 0.25) for rid in range(20_000)]
    assert sum(picks) / len(picks) == pytest.approx(0.25, abs=0.01)
    assert picks == [in_remote_class(1, rid, 0.25) for rid in range(20_000)]  # a pure function of (seed, id)
    assert picks != [in_remote_class(2, rid, 0.25) for rid in range(20_000)]
    assert all(in_remote_class(7, rid, 1.0) for rid in range(100))
    scenario = Scenario.build(**REMOTE, remote_share=0.25)
    assert [SelectionSection.of(scenario).is_remote_request(scenario, r) for r in range(100)] == picks[:100]
    assert not any(SelectionSection.of(Scenario()).is_remote_request(Scenario(), r) for r in range(100))


def test_a_steps_legs_move_the_selection_models_bytes_for_each_remote_request():
    remote = Scenario.build(**REMOTE)
    step = SelectionSection.of(remote).selection_step(remote)  # llama3-8b, 32k, 1/16 of mean-key pages
    legs = RemoteLegs(step, requests=3)
    assert legs.summary_bytes == 3 * step.summary_bytes
    assert legs.page_bytes == 3 * step.chosen_kv_bytes
    assert legs.attended_tokens == 3 * (step.chosen_pages * 16 + step.tail_tokens) == 3 * 2048
    all_pages = Scenario.build(**REMOTE, select="all")
    every = RemoteLegs(SelectionSection.of(all_pages).selection_step(all_pages), requests=2)
    assert every.summary_bytes == 0 and every.page_bytes == 2 * step.all_kv_bytes
    assert every.attended_tokens == 2 * 32768


def test_each_leg_is_a_request_and_its_answer_and_the_module_holds_the_summaries_when_slower():
    link = link_by_name("eth-100g")
    pages = leg_s(link, 1e9)
    assert pages == pytest.approx(2 * link.latency_s + 1e9 / link.bandwidth_Bps)
    assert legs_model_s(link, 0, 1e9, module_latency_s=0, occupancy=0) == pages  # no selection: one leg
    both = legs_model_s(link, 5e8, 1e9, module_latency_s=1e-6, occupancy=0.6)
    assert both == pytest.approx(leg_s(link, 5e8) + pages + 2e-6)
    slow = legs_model_s(link, 5e8, 1e9, module_latency_s=0, occupancy=2.5)  # transit-bound: 2.5x the wire
    assert slow == pytest.approx(leg_s(link, 2.5 * 5e8) + pages)


@pytest.fixture(scope="module")
def small():
    """A small remote context: llama3-8b at 1/256 (4 channels), 1,024 tokens, 64 pages of 16."""
    scenario = Scenario.build(**REMOTE, link="eth-100g", remote_context=1024 + 5, select_budget=1 / 8)
    return scenario, RemoteContexts(scenario)


def test_the_pool_serves_each_contexts_page_summaries_and_exactly_the_pages_asked_for(small):
    _, contexts = small
    s = contexts.shapes
    assert (s.pages, s.tail, s.chosen) == (64, 5, 8)
    summaries = array_from(contexts.summaries([3, 9]), BF16, s.summary_shape(2), "SUMMARIES")
    kv = contexts._context(9)[0].astype(np.float64)  # [layers, 2, kv_heads, tokens, D]
    want = page_summaries(kv[:, 0, :, :s.pages * s.page_size], s.page_size).mean
    np.testing.assert_allclose(summaries[1, 0].astype(np.float64), want, rtol=1e-2, atol=1e-2)  # BF16 on the wire
    ids = np.random.default_rng(0).integers(0, s.pages, size=(2, s.layers, s.kv_heads, s.chosen)).astype(np.int32)
    pages = array_from(contexts.pages([3, 9], ids), BF16, s.pages_shape(2, True), "PAGES")
    layer, head, slot = 2, 0, 5
    page = ids[1, layer, head, slot]
    np.testing.assert_array_equal(
        pages[1, layer, :, head, slot * 16:(slot + 1) * 16].astype(np.float64),
        kv[layer, :, head, page * 16:(page + 1) * 16])
    np.testing.assert_array_equal(pages[1, layer, :, head, -5:].astype(np.float64), kv[layer, :, head, -5:])
    everything = array_from(contexts.pages([9], None), BF16, s.pages_shape(1, False), "PAGES")
    np.testing.assert_array_equal(everything[0].astype(np.float64), kv)
    with pytest.raises(LegError, match="outside its 64 pages"):
        contexts.pages([9], np.full((1, s.layers, s.kv_heads, s.chosen), 64, np.int32))


def test_every_fetched_page_is_the_contexts_own_for_every_layer_kv_head_and_slot():
    # 1/32: 8 kv heads of 4 channels, so a page's rows are told apart per head; a 5-token tail.
    scenario = Scenario.build(**REMOTE, link="eth-100g", scale=1 / 32, remote_context=512 + 5, select_budget=1 / 4)
    contexts = RemoteContexts(scenario)
    s = contexts.shapes
    assert s.kv_heads == 8 and s.tail == 5
    ids = np.random.default_rng(1).integers(0, s.pages, size=(2, s.layers, s.kv_heads, s.chosen)).astype(np.int32)
    got = array_from(contexts.pages([4, 7], ids), BF16, s.pages_shape(2, True), "PAGES")
    for i, rid in enumerate((4, 7)):
        kv = contexts._context(rid)[0]
        tokens = (ids[i][..., None] * s.page_size + np.arange(s.page_size)).reshape(s.layers, s.kv_heads, -1)
        want = np.take_along_axis(kv[..., :s.pages * s.page_size, :], tokens[:, None, :, :, None], axis=3)
        np.testing.assert_array_equal(got[i, ..., :-s.tail, :].view(np.uint16), want.view(np.uint16))
        np.testing.assert_array_equal(got[i, ..., -s.tail:, :].view(np.uint16), kv[..., -s.tail:, :].view(np.uint16))


def test_the_modules_scores_match_a_float64_reference_and_the_host_picks_the_references_top_pages(small):
    scenario, contexts = small
    s = contexts.shapes
    queries = step_queries(s, scenario.seed, [3, 9], step=4)
    assert np.array_equal(queries, step_queries(s, scenario.seed, [3, 9], step=4))  # deterministic per step
    summaries = array_from(contexts.summaries([3, 9]), BF16, s.summary_shape(2), "SUMMARIES")
    got = score(s, queries, summaries, None)
    group = s.q_heads // s.kv_heads
    q = queries.astype(np.float64).reshape(2, s.layers, s.kv_heads, group, s.head_dim).sum(axis=3)
    want = np.einsum("nlhd,nlhpd->nlhp", q, summaries[:, 0].astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)  # float32 on the wire
    chosen = choose(s, got)
    assert chosen.shape == (2, s.layers, s.kv_heads, s.chosen)
    np.testing.assert_array_equal(chosen, top_k_pages(want, s.chosen))


def test_quests_bound_scored_on_the_host_is_the_kernels_own():
    host = Scenario.build(**{**REMOTE, "link": "eth-100g", "remote_context": 1024, "select_summary": "minmax",
                       "policy": "host"})
    contexts = RemoteContexts(host)
    s = contexts.shapes
    summaries = array_from(contexts.summaries([1]), BF16, s.summary_shape(1), "SUMMARIES")
    queries = step_queries(s, host.seed, [1], step=0)
    got = score(s, queries, summaries, None)
    low, high = summaries[0, 0].astype(np.float64), summaries[0, 1].astype(np.float64)
    q = queries[0].astype(np.float64).reshape(s.layers, s.kv_heads, -1, s.head_dim)
    bound = np.maximum(q[:, :, :, None, :] * low[:, :, None], q[:, :, :, None, :] * high[:, :, None]).sum(-1).sum(2)
    np.testing.assert_allclose(got[0], bound, rtol=1e-5, atol=1e-4)
    assert PageSummaries("minmax", 16, low=low, high=high).pages == s.pages


def test_the_pool_makes_the_next_remote_contexts_ahead_of_their_requests():
    scenario = Scenario.build(**REMOTE, link="eth-100g", remote_context=512, remote_share=0.5)
    contexts = RemoteContexts(scenario)
    contexts.make_ahead(-1, count=3)
    remote = [rid for rid in range(100) if SelectionSection.of(scenario).is_remote_request(scenario, rid)][:4]
    contexts.summaries(remote[:3])
    assert contexts.made_on_demand == 0
    contexts.summaries([remote[3]])
    assert contexts.made_on_demand == 1


def test_a_leg_names_its_requests_and_a_short_or_foreign_leg_is_refused():
    ids, rest = unpack_ids(pack_ids([4, 7]) + b"xyz", "QUERY")
    assert ids == [4, 7] and bytes(rest) == b"xyz"
    with pytest.raises(LegError, match="too short"):
        unpack_ids(b"\x01", "PAGES")
    with pytest.raises(LegError, match="names 5 requests"):
        unpack_ids(pack_ids([1, 2, 3, 4, 5])[:24], "PAGES")
    with pytest.raises(LegError, match="expected 16 B"):
        array_from(b"\x00" * 8, np.dtype(np.float32), (2, 2), "SCORES")


def test_remote_shapes_follow_the_scaled_layout():
    scenario = Scenario.build(**REMOTE, link="eth-100g")
    s = RemoteShapes.of(scenario)
    layout = scenario.kv_layout
    assert (s.layers, s.kv_heads, s.head_dim) == (layout.layers, layout.kv_heads, layout.head_dim)
    assert s.q_heads == s.kv_heads * 4  # llama3-8b: 32 query heads over 8 kv heads
    assert s.nbytes(s.pages_shape(1, True)) * (1 / scenario.effective_scale) == pytest.approx(
        SelectionSection.of(scenario).selection_step(scenario).chosen_kv_bytes)
    assert math.isclose(s.nbytes(s.summary_shape(1)) / scenario.effective_scale,
                        SelectionSection.of(scenario).selection_step(scenario).summary_bytes)


def test_a_sweep_row_carries_the_remote_legs_and_each_class_tpot():
    from kvtransit.flows.selection.report import REPORT

    _remote_kv_columns = REPORT.columns

    block = {"select": "top-k", "budget": 0.0625, "legs_s": {"measured": 0.021, "model": 0.020},
             "summary_bytes": {"measured": 1e8}, "page_bytes": {"measured": 2e8},
             "tpot_ms": {"remote": {"p50": 30.0}, "local": None}}
    assert _remote_kv_columns({"remote_kv": block}) == {
        "select": "top-k", "select_budget": 0.0625, "remote_legs_ms": 21.0, "model_remote_legs_ms": 20.0,
        "remote_bytes_per_step": 3e8, "remote_tpot_p50_ms": 30.0, "local_tpot_p50_ms": None}
    assert _remote_kv_columns({"remote_kv": None}) == {}
    assert field_from_text("select", "all") == "all"  # a grid's axis reads as the flag does


@pytest.mark.parametrize("scale,fixed", [("auto", "at a fixed --scale 1/256"), (1 / 256, None)])
def test_slow_legs_under_the_auto_scale_are_told_to_dilate_at_a_fixed_scale(scale, fixed):
    from kvtransit.report.blocks import RunData, flow_reports
    from kvtransit.report.fidelity import fidelity_block

    scenario = Scenario.build(**REMOTE, link="eth-100g", scale=scale)
    decode = {"role": "decode", "name": "decode-0", "remote_kv": {"ratio_median": 1.3, "idle_link_steps": 9}}
    run = RunData(scenario, [], [decode], prefills=[], decodes=[decode], middleboxes=[], run_model_s=1.0, summary={})
    faithful, block = fidelity_block(run, flow_reports(), scaled_achieved_Bps=None)
    check = block["remote_kv_decode-0"]
    assert not faithful and check["ok"] is False and check["measured"] == pytest.approx(0.3)
    assert "try --dilation" in check["hint"]
    assert (fixed in check["hint"]) if fixed else ("--scale" not in check["hint"])
