"""A live group's fidelity (model/judge/fidelity.py: model_gap, group_fidelity): within the emulator's band of the model
or not, and never faithful when unmeasured or failed (fail closed)."""

from __future__ import annotations

import math

from kvtransit.model.judge.fidelity import GROUP_TOLERANCE, group_fidelity, model_gap


def test_a_figure_within_the_band_is_faithful_and_one_outside_says_what_dilation_would_do():
    assert model_gap(1.04, 1.0, 2.0, "the step").ok
    off = model_gap(1.10, 1.0, 2.0, "the step")
    assert not off.ok and math.isclose(off.measured, 0.10)
    assert off.hint == "the step +10.0% off the model: try --dilation 6"  # 2 × (1 + 0.10 / 0.05)
    assert GROUP_TOLERANCE == 0.05  # a step's timers (3 %) and a transfer's (2 %)


def test_unmeasured_or_failed_is_never_faithful():
    for measured in (None, math.nan, math.inf):
        gap = model_gap(measured, 1.0, 1.0, "the prompt")
        assert not gap.ok and gap.hint.startswith("not measured")
    assert not model_gap(1.0, 0.0, 1.0, "the prompt").ok
    failed = group_fidelity(False, ["rank 1 was killed"], {"step": model_gap(1.0, 1.0, 1.0, "the step")})
    assert failed["faithful"] is False and "the run failed (rank 1 was killed)" in failed["faithful_line"]
    assert group_fidelity(False, [], {})["faithful"] is False  # nothing measured at all


def test_the_verdict_line_names_every_failed_check():
    block = group_fidelity(True, [], {"cold start": model_gap(1.2, 1.0, 1.0, "the cold start"),
                                      "paged-in TTFT": model_gap(1.01, 1.0, 1.0, "a paged-in TTFT")})
    assert block["faithful"] is False
    assert block["faithful_line"] == "NO (the cold start +20.0% off the model: try --dilation 5)"
    assert group_fidelity(True, [], {"step": model_gap(1.0, 1.0, 1.0, "the step")})["faithful_line"] == "yes"
