"""The engine run's agreement measures (flows/engine/engine_report.py): pure, from token ids and log-probabilities."""

from __future__ import annotations

import math

from kvtransit.flows.engine.engine_report import first_divergence, kl_and_top1


def test_first_divergence_names_the_first_differing_token_or_none_when_equal():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2


def test_kl_is_zero_for_the_same_distribution_and_top1_counts_argmax_agreement():
    p = {"1": math.log(0.7), "2": math.log(0.2), "3": math.log(0.1)}
    q = {"1": math.log(0.2), "2": math.log(0.7), "3": math.log(0.1)}
    same = kl_and_top1([p, p], [p, p])
    assert same["kl_nats_per_token"] == 0.0 and same["top1_agree"] == 1.0 and same["positions"] == 2
    moved = kl_and_top1([p, p], [p, q])
    expected = (0.7 * math.log(0.7 / 0.2) + 0.2 * math.log(0.2 / 0.7)) / 2
    assert math.isclose(moved["kl_nats_per_token"], expected)
    assert moved["top1_agree"] == 0.5


def test_positions_without_log_probabilities_are_not_scored():
    p = {"1": 0.0}
    assert kl_and_top1([None, p], [p, None])["positions"] == 0
