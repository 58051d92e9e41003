"""flows/selection/model.py: bytes per decode step with and without selection, and the scoring kernels' budget."""

from __future__ import annotations

import pytest

from kvtransit.flows.selection import model as sel
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.catalog.models import model_by_name
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Action, Policy, Verdict

LLAMA = model_by_name("llama3-8b")  # 32 layers, 8 kv heads, head_dim 128: 131,072 B of KV a token


def test_without_selection_a_step_fetches_all_of_the_context():
    step = sel.SelectionStep(LLAMA, 32768)
    assert step.fetched_bytes == step.all_kv_bytes == 32768 * 131072
    assert step.summary_bytes == 0 and step.reduction == 1.0


def test_selection_fetches_the_chosen_pages_plus_one_summary_key_a_page():
    step = sel.SelectionStep(LLAMA, 32768, budget=1 / 16)
    assert step.pages == 2048 and step.chosen_pages == 128
    assert step.chosen_kv_bytes == 128 * 16 * 131072
    assert step.summary_bytes == 2048 * 32 * 8 * 128 * 2  # one mean key a page, kv head and layer
    # 1/16 of the KV plus a key per 16 tokens (1/32 of the KV): 1 / (1/16 + 1/32) = 10.67x fewer bytes.
    assert step.reduction == pytest.approx(32 / 3)


def test_quest_summaries_are_twice_the_mean_keys():
    mean = sel.SelectionStep(LLAMA, 32768, budget=1 / 8)
    quest = sel.SelectionStep(LLAMA, 32768, budget=1 / 8, kind="minmax")
    assert quest.summary_bytes == 2 * mean.summary_bytes


def test_the_tokens_after_the_last_whole_page_are_always_fetched():
    step = sel.SelectionStep(LLAMA, 100, budget=1 / 4)
    assert (step.pages, step.tail_tokens, step.chosen_pages) == (6, 4, 2)
    assert step.chosen_kv_bytes == (2 * 16 + 4) * 131072


def test_selection_shortens_the_fetch_on_eth_100g_by_about_the_byte_ratio():
    link = link_by_name("eth-100g")
    everything = sel.SelectionStep(LLAMA, 32768).fetch_time_s(link)
    chosen = sel.SelectionStep(LLAMA, 32768, budget=1 / 16).fetch_time_s(link)
    assert everything == pytest.approx(2 * 20e-6 + 32768 * 131072 / 12.5e9)  # the request, and the answer
    assert everything / chosen == pytest.approx(32 / 3, rel=0.01)


def test_scoring_in_transit_adds_the_modules_latency_and_at_the_low_budget_its_compute():
    link = link_by_name("eth-100g")
    step = sel.SelectionStep(LLAMA, 32768, budget=1 / 16)
    wire = step.fetch_time_s(link)
    assert step.fetch_time_s(link, sel.MODULE_HIGH) == pytest.approx(wire + sel.MODULE_HIGH.added_latency_s)
    # At 0.40 op/B the 1.00 op/B kernel runs at 0.4 of the line rate: the summaries' leg is 2.5x its wire time.
    slow = step.fetch_time_s(link, sel.MODULE_LOW)
    assert slow - wire == pytest.approx(1.5 * step.summary_bytes / 12.5e9 + sel.MODULE_LOW.added_latency_s)


def test_mean_key_scoring_is_one_op_a_byte_of_mac_and_fits_the_high_budget_not_the_low():
    decl = sel.scoring_declaration(LLAMA, "mean")
    assert decl.charged_ops_per_byte == 1.00 and decl.op_types == {"mac"} and decl.ratio == 128
    assert sel.scoring_budget(LLAMA, "mean", sel.MODULE_HIGH).verdict is Verdict.FITS
    low = sel.scoring_budget(LLAMA, "mean", sel.MODULE_LOW)
    assert low.verdict is Verdict.TRANSIT_BOUND and low.slowdown == pytest.approx(2.5)


def test_quests_bound_needs_a_comparison_so_it_is_refused_or_runs_on_the_host():
    refused = sel.scoring_budget(LLAMA, "minmax")
    assert refused.verdict is Verdict.NOT_ALLOWED and refused.action is Action.REJECTED
    assert refused.unpublished_ops == {"comparison"}
    assert sel.scoring_budget(LLAMA, "minmax", policy=Policy.HOST).action is Action.ON_HOST


def test_a_page_size_that_does_not_divide_the_pools_blocks_is_refused_with_the_valid_sizes():
    with pytest.raises(ConfigError, match=r"page size 24 does not divide the context's 512-token blocks "
                                          r"\(valid page sizes: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512\)"):
        sel.SelectionStep(LLAMA, 4096, budget=1 / 8, page_size=24)


@pytest.mark.parametrize("budget", [0, 0.0, 1.01, 2, float("nan")])
def test_a_budget_of_zero_or_above_one_is_refused_with_the_valid_values(budget):
    with pytest.raises(ConfigError, match=r"page budget must be a fraction in \(0, 1\] \(e.g. 1/4, 1/8, 1/16\)"):
        sel.SelectionStep(LLAMA, 4096, budget=budget)


def test_an_unknown_summary_kind_is_refused():
    with pytest.raises(ConfigError, match=r"unknown summary kind 'max' \(choose from: mean, minmax\)"):
        sel.SelectionStep(LLAMA, 4096, budget=1 / 8, kind="max")
