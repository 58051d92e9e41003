"""kernels/selection.py: page summaries, scoring at precision_bits, the host's top-k, and what a selection keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvtransit.kernels import selection as sel
from kvtransit.kernels.accuracy import attention_outputs
from kvtransit.kernels.errors import KernelInputError


def _keys(seed: int = 0, heads: int = 2, tokens: int = 64, d: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((heads, tokens, d))


def _reference_scores(query: np.ndarray, keys: np.ndarray, page_size: int, kind: str) -> np.ndarray:
    """Page by page, token by token, in float64: the definition, with no vectorisation shared with the kernel."""
    heads, tokens, d = keys.shape
    out = np.zeros((heads, tokens // page_size))
    for h in range(heads):
        for p in range(tokens // page_size):
            page = keys[h, p * page_size : (p + 1) * page_size]
            if kind == "mean":
                out[h, p] = sum(query[h, c] * page[:, c].sum() / page_size for c in range(d))
            else:
                out[h, p] = sum(max(query[h, c] * page[:, c].min(), query[h, c] * page[:, c].max()) for c in range(d))
    return out


@pytest.mark.parametrize("kind", sel.SUMMARY_KINDS)
def test_full_precision_scores_equal_a_float64_reference(kind):
    keys = _keys()
    query = np.random.default_rng(1).standard_normal((2, 8))
    got = sel.score_pages(query, sel.page_summaries(keys, 16, kind))
    np.testing.assert_allclose(got, _reference_scores(query, keys, 16, kind), rtol=1e-12, atol=1e-12)


def test_quests_bound_is_never_below_any_key_of_its_page():
    keys = _keys(seed=3)
    query = np.random.default_rng(4).standard_normal((2, 8))
    bound = sel.score_pages(query, sel.page_summaries(keys, 16, "minmax"))
    exact = np.einsum("hd,htd->ht", query, keys).reshape(2, 4, 16).max(axis=-1)
    assert (bound >= exact - 1e-12).all()


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_scores_at_precision_bits_stay_within_the_quantisers_error(bits):
    keys = _keys(seed=5)
    query = np.random.default_rng(6).standard_normal((2, 8))
    summaries = sel.page_summaries(keys, 16, "mean")
    full = sel.score_pages(query, summaries)
    low = sel.score_pages(query, summaries, bits)
    assert not np.array_equal(full, low)
    # Each operand's error is at most half a step (FS / 2^bits) per value, and the result is rounded once more.
    q_fs, k_fs = np.abs(query).max(), np.abs(summaries.mean).max()
    bound = 8 * (q_fs * k_fs * 2 / 2**bits + (k_fs / 2**bits) ** 2) + np.abs(low).max() / 2**bits
    assert np.abs(low - full).max() <= bound


def test_quantise_rounds_each_vector_to_its_own_grid():
    x = np.array([[1.0, 0.3, -0.5], [100.0, 1.0, 0.0]])
    got = sel.quantise(x, 4)  # step = 2·FS/16: 0.125 for the first row, 12.5 for the second
    np.testing.assert_allclose(got, [[1.0, 0.25, -0.5], [100.0, 0.0, 0.0]])


def test_top_k_picks_the_same_pages_as_a_reference_for_a_fixed_seed():
    scores = np.random.default_rng(7).standard_normal((3, 40)).round(1)  # rounding makes ties
    got = sel.top_k_pages(scores, 5)
    for row, chosen in zip(scores, got, strict=True):
        reference = sorted(sorted(range(40), key=lambda p: (-row[p], p))[:5])
        assert chosen.tolist() == reference


def test_top_k_breaks_ties_to_the_lower_page():
    assert sel.top_k_pages(np.array([1.0, 2.0, 2.0, 2.0]), 2).tolist() == [1, 2]


def test_top_k_is_the_stable_sort_of_the_scores_for_every_k_shape_and_run_of_ties():
    rng = np.random.default_rng(11)
    for scores in (rng.standard_normal((2, 3, 4, 24)), rng.integers(-2, 3, (2, 3, 4, 24)).astype(np.float64),
                   np.zeros((5, 24)), np.array([[-0.0, 0.0, -0.0, 1.0] * 6])):
        for k in (1, 2, 7, 23, 24):
            want = np.sort(np.argsort(-scores, axis=-1, kind="stable")[..., :k], axis=-1)
            np.testing.assert_array_equal(sel.top_k_pages(scores, k), want)


def test_a_planted_needle_is_found_at_budget_one_sixteenth_on_synthetic_kv():
    for context in (1024, 16384):
        for seed in range(4):
            keys, query, at = sel.needle_context(context, 64, seed, strength=2.0)
            trial = sel.needle_trial(keys, query, at, 1 / 16)
            assert trial.found, (context, seed, trial)
            assert trial.chosen == context // 16 // 16


def test_a_needle_key_holds_most_of_exact_attention():
    keys, query, at = sel.needle_context(4096, 64, 0, strength=2.0)
    logits = keys[0] @ query[0] / math.sqrt(64)
    w = np.exp(logits - logits.max())
    assert w.argmax() == at and w[at] / w.sum() > 0.9


def test_selecting_every_page_is_exact():
    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, 4, 3, 8))
    k, v = rng.standard_normal((1, 2, 64, 8)), rng.standard_normal((1, 2, 64, 8))
    quality = sel.evaluate_selection(q, k, v, np.array([40, 50, 63]), 1.0)
    assert quality.recall == pytest.approx(1.0)
    assert quality.output_error < 1e-12


def test_output_error_matches_attention_over_the_chosen_pages_only():
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 2, 1, 8))
    k, v = rng.standard_normal((1, 1, 64, 8)), rng.standard_normal((1, 1, 64, 8))
    quality = sel.evaluate_selection(q, k, v, np.array([63]), 1 / 4, kind="mean")
    chosen = sel.select_pages(q[0, :, 0], k[0], 1 / 4)[0]
    tokens = np.concatenate([np.arange(p * 16, p * 16 + 16) for p in chosen])
    ref = attention_outputs(q[0], k[0], v[0], np.array([63]))
    got = attention_outputs(q[0], k[0][:, tokens], v[0][:, tokens], np.array([63]), tokens)
    assert quality.output_error == pytest.approx(np.linalg.norm(got - ref) / np.linalg.norm(ref), rel=1e-9)
    scores = np.einsum("hd,td->ht", q[0, :, 0], k[0, 0]) / math.sqrt(8)
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    assert quality.recall == pytest.approx(float(w[:, tokens].sum(axis=-1).mean()), rel=1e-9)


def test_a_sink_page_is_kept_within_the_budget():
    keys = _keys(seed=10, heads=1)
    query = -keys[0, :16].mean(axis=0, keepdims=True)  # page 0 scores worst
    assert 0 not in sel.select_pages(query, keys, 1 / 4)[0]
    chosen = sel.select_pages(query, keys, 1 / 4, sink_pages=1)[0]
    assert 0 in chosen and len(chosen) == 1


def test_gqa_mean_selection_scores_the_summed_query_of_each_group():
    keys = _keys(seed=11, heads=2)
    queries = np.random.default_rng(12).standard_normal((6, 8))  # 3 query heads per kv head
    summaries = sel.page_summaries(keys, 16)
    per_head = np.stack([sum(sel.score_pages(queries[h * 3 + g][None], sel.page_summaries(keys[h:h + 1], 16))[0]
                             for g in range(3)) for h in range(2)])
    assert summaries.pages == 4
    assert sel.select_pages(queries, keys, 1 / 2).tolist() == sel.top_k_pages(per_head, 2).tolist()


def test_a_page_size_that_does_not_divide_the_context_is_refused_with_the_valid_sizes():
    with pytest.raises(KernelInputError, match=r"page size 16 does not divide the context's 40 tokens "
                                               r"\(valid page sizes: 1, 2, 4, 5, 8, 10, 20, 40\)"):
        sel.page_summaries(_keys(tokens=40), 16)


@pytest.mark.parametrize("budget", [0, 0.0, 1.5, -0.25, float("nan")])
def test_a_budget_of_zero_or_above_one_is_refused_with_the_valid_values(budget):
    with pytest.raises(KernelInputError, match=r"page budget must be a fraction in \(0, 1\] \(e.g. 1/4, 1/8, 1/16\)"):
        sel.pages_for_budget(24, budget)


def test_budgets_round_up_to_whole_pages():
    assert [sel.pages_for_budget(24, b) for b in sel.BUDGETS] == [6, 3, 2]
    assert sel.pages_for_budget(2048, 1 / 16) == 128


def test_an_unknown_summary_kind_and_bad_precision_are_refused():
    with pytest.raises(KernelInputError, match=r"unknown summary kind 'max' \(choose from: mean, minmax\)"):
        sel.page_summaries(_keys(), 16, "max")
    with pytest.raises(KernelInputError, match=r"precision_bits must be an integer in 2\.\.32 or None"):
        sel.quantise(np.ones(3), 1)
