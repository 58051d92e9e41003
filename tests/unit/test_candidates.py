"""The candidate table's verdict rule and its flip search (harness/studies/candidates/table.py), on hand-made
measurements."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtransit.flows.tier.section import TierSection
from kvtransit.harness.studies.candidates.rows import candidate_names
from kvtransit.harness.studies.candidates.table import (
    CANDIDATE,
    LINE_INPUT,
    NOT_A_CANDIDATE,
    NOT_RUN,
    PROMISING,
    PrecisionFigure,
    RowMeasured,
    Unknowns,
    declared_budget_test,
    figure_precision_test,
    judge_row,
    rescaled_share,
)
from kvtransit.harness.studies.candidates.verdicts import flips, judge_table, verdict_flips
from kvtransit.model.catalog.codecs import codec_declaration
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE
from kvtransit.model.module.budget import MODULE_BUDGETS, KernelDeclaration
from kvtransit.workload.trace_file import trace_path

SIM = Unknowns()
EXACT = PrecisionFigure(0.0, 0.0, "values not returned exactly", required_bits=12)
LOSSY = PrecisionFigure(0.05, 0.08, "output error vs the equal-bytes baseline's")
# A MAC kernel of 1.0 op per input byte, as the link carries its input: fits sim (1.6), not low (0.40).
MAC = KernelDeclaration("mac-1", ratio=4.0, ops_per_byte=1.0, op_types=frozenset({"mac"}))


def row(**fields) -> RowMeasured:
    base = dict(name="hand-made", decl=MAC, share=0.4, share_of="made-up share", link="eth-25g", link_bytes=1e8,
                line=LINE_INPUT, precision=EXACT, streams=1.0)
    return RowMeasured(**(base | fields))


def verdict(r: RowMeasured, u: Unknowns = SIM):
    (v,) = judge_table([r], u)
    return v


def test_a_row_passing_all_five_is_a_candidate():
    v = verdict(row())
    assert v.verdict == CANDIDATE
    assert [t.passed for t in v.tests.tests] == [True] * 5


def test_one_measured_failure_that_a_higher_budget_fixes_is_promising_and_names_the_change():
    heavy = replace(MAC, name="mac-3", ops_per_byte=3.0)  # 3.0 > sim 1.6, <= high 3.96
    v = verdict(row(decl=heavy))
    assert v.tests.failing == ("budget",)
    assert v.verdict == PROMISING
    assert "module budget 1.6 -> 3 (its own ops per line byte)" in v.why


def test_a_budget_beyond_the_published_range_is_not_a_change_that_makes_a_row_promising():
    too_heavy = replace(MAC, name="mac-12", ops_per_byte=12.0)  # above high 3.96: no module affords it
    v = verdict(row(decl=too_heavy))
    assert v.tests.failing == ("budget",)
    assert v.verdict == NOT_A_CANDIDATE


def test_an_unpublished_operation_is_not_a_candidate_since_no_unknown_publishes_it():
    v = verdict(row(decl=codec_declaration("fp8"), line="output", precision=LOSSY))
    assert v.tests.failing == ("operations",)
    assert v.verdict == NOT_A_CANDIDATE


def test_a_test_not_measured_never_counts_as_passed():
    v = verdict(row(precision=PrecisionFigure(None, 0.0, "nothing sampled", required_bits=12)))
    assert v.tests.failing == ("precision",)
    assert v.verdict == NOT_A_CANDIDATE
    assert "precision (not measured)" in v.why


def test_two_failures_are_not_a_candidate_even_when_each_could_flip():
    heavy = replace(MAC, name="mac-3", ops_per_byte=3.0)
    v = verdict(row(decl=heavy, share=0.01))
    assert set(v.tests.failing) == {"bottleneck", "budget"}
    assert v.verdict == NOT_A_CANDIDATE


def test_a_row_that_could_not_run_says_why_and_is_not_judged():
    v = verdict(row(not_run="not run: install .[fhe]"))
    assert v.verdict == NOT_RUN and v.tests is None and v.why == "not run: install .[fhe]"


def test_the_flip_search_finds_the_nearest_budget_that_breaks_a_candidate():
    (budget,) = [f for f in flips(row(), SIM) if f.unknown == "module budget"]
    assert budget.change == f"module budget 1.6 -> {MODULE_BUDGETS['low']:g} (low) ops/line B"
    assert not budget.passes_after and budget.failing_after == ("budget",)


def test_the_flip_search_finds_the_fewest_bits_an_exact_flow_survives():
    (bits,) = [f for f in flips(row(), SIM) if f.unknown == "precision bits"]
    assert bits.change == "precision exact -> 11 bits"  # 12 bits still pass; 11 is the first that cannot
    assert bits.failing_after == ("precision",)


def test_a_lossy_flow_measured_exact_is_not_measured_at_other_bits_and_is_not_searched():
    r = row(precision=LOSSY)
    assert judge_row(r, replace(SIM, precision_bits=8)).tests[3].passed is None
    assert not [f for f in flips(r, SIM) if f.unknown == "precision bits"]


def test_the_flip_search_finds_the_nearest_faster_link_that_hides_the_flow():
    # 20 % of E2E on eth-25g (3.125 GB/s, 20 µs), 100 MB a time: on the nearest faster link (eth-100g, 4x) it is 6 %.
    r = row(share=0.2)
    (link,) = [f for f in flips(r, SIM) if f.unknown == "link"]
    assert link.failing_after == ("bottleneck",)
    assert link.change == "link eth-25g -> eth-100g"


def test_a_modelled_rows_share_on_another_link_is_the_models_not_a_rescale():
    r = row(share=0.5, share_by_link={"eth-25g": 0.5, "eth-100g": 0.03}, share_modelled=True)
    judged = judge_row(r, replace(SIM, link="eth-100g"))
    assert judged.tests[0].values["share"] == 0.03
    assert judged.tests[0].passed is False and "(modelled)" in judged.tests[0].measured


def test_charging_the_transform_flips_band_keep_out_of_budget():
    band_keep = codec_declaration("freq-keep-k")  # DCT of 64 free in passive optics: 0 ops
    r = row(decl=band_keep, line="output", precision=LOSSY)
    assert verdict(r).verdict == CANDIDATE
    (transform,) = [f for f in flips(r, SIM) if f.unknown == "transform"]
    assert transform.change == "transform free -> charged" and transform.failing_after == ("budget",)


def test_a_declaration_with_its_transform_in_its_ops_is_swapped_for_its_other_form():
    charged = KernelDeclaration("ntt-like", ratio=2.0, ops_per_byte=12.0, op_types=frozenset({"ntt", "modular"}))
    free = replace(charged, ops_per_byte=1.5, transform_charged=False)
    r = row(decl=charged, decl_other_transform=free)
    assert judge_row(r, SIM).tests[2].passed is False
    assert judge_row(r, replace(SIM, transform_charged=False)).tests[2].passed is True


def test_the_budget_counts_ops_per_byte_of_the_side_the_link_carries():
    summing = KernelDeclaration("sum-4", ratio=4.0, ops_per_byte=0.5, op_types=frozenset({"float"}),
                                placement="switch", streams=4)
    assert declared_budget_test(summing, 1.6, "no stage", "input").passed is True  # 0.5 per arriving byte
    assert declared_budget_test(summing, 1.6, "no stage", "output").passed is False  # 0.5 × 4 per sent byte


def test_an_analogue_path_below_an_exact_flows_bits_fails_precision():
    decl = replace(MAC, precision_bits=8)
    judged = figure_precision_test(decl, EXACT)
    assert judged.passed is False and "needs 12 exact bits" in judged.reason


def test_rescaling_a_share_by_the_link_model():
    slow, fast = LINKS["eth-25g"], LINKS["eth-100g"]
    nbytes = 1e9
    r = (fast.latency_s + nbytes / fast.bandwidth_Bps) / (slow.latency_s + nbytes / slow.bandwidth_Bps)
    assert rescaled_share(0.5, slow, fast, nbytes) == pytest.approx(r * 0.5 / (r * 0.5 + 0.5))
    assert rescaled_share(0.0, slow, fast, nbytes) == 0.0
    assert rescaled_share(0.3, slow, slow, nbytes) == 0.3


def test_the_bottleneck_threshold_is_five_tests_own():
    assert judge_row(row(share=BOTTLENECK_MIN_SHARE), SIM).tests[0].passed is True
    assert judge_row(row(share=BOTTLENECK_MIN_SHARE * 0.99), SIM).tests[0].passed is False


def test_candidate_names_keep_table_order_and_an_unknown_one_lists_the_valid():
    assert candidate_names(None) == ("kv-tier-fetch", "kv-handoff", "query-aware-selection", "ring-attention",
                                     "moe-all-to-all", "tp-all-reduce", "weight-streaming", "fhe-inference",
                                     "pq-key-exchange")  # docs/reference.md §8's order, whichever flow brings the row
    assert candidate_names("weight-streaming,pq-key-exchange") == ("weight-streaming", "pq-key-exchange")
    with pytest.raises(ConfigError, match=r"unknown candidate 'kv-handof' \(choose from: .*kv-handoff"):
        candidate_names("kv-handof")


@pytest.mark.parametrize("fields,match", [
    ({"precision_bits": 0}, "precision bits"),
    ({"module_budget": -1.0}, "module budget"),
    ({"link": "eth-400g"}, "eth-400g"),
])
def test_bad_unknowns_are_one_line_errors(fields, match):
    with pytest.raises(ConfigError, match=match):
        Unknowns(**fields)


def test_a_change_that_leaves_one_fixable_failure_flips_not_a_candidate_to_promising():
    heavy = replace(MAC, name="mac-3", ops_per_byte=3.0)
    narrow = replace(SIM, precision_bits=8)  # 8 bits < the 12 the flow needs: precision fails too
    assert verdict(row(decl=heavy), narrow).verdict == NOT_A_CANDIDATE
    (budget,) = [f for f in verdict_flips(row(decl=heavy), narrow) if f.unknown == "module budget"]
    assert budget.verdict_after == PROMISING and budget.failing_after == ("precision",) and not budget.closer
    (bits,) = [f for f in verdict_flips(row(decl=heavy), narrow) if f.unknown == "precision bits"]
    assert bits.change == "precision 8 bits -> 12 bits" and bits.verdict_after == PROMISING


def test_where_no_change_flips_the_verdict_the_nearest_that_fixes_a_test_is_shown():
    charged = KernelDeclaration("ntt-like", ratio=2.0, ops_per_byte=12.0, op_types=frozenset({"ntt", "modular"}))
    free = replace(charged, ops_per_byte=1.5, transform_charged=False)
    r = row(decl=charged, decl_other_transform=free, share=0.01, link_bytes=None)  # bottleneck fails, no link search
    (transform,) = [f for f in verdict_flips(r, SIM) if f.unknown == "transform"]
    assert transform.closer and transform.failing_after == ("bottleneck",)
    assert transform.describe() == "transform charged -> free: still not a candidate, failing only bottleneck"


def test_the_tier_row_runs_the_tier_deck_presets_in_transit_point_under_the_tables_unknowns(tmp_path):
    from pathlib import Path

    from kvtransit.flows.tier.rows import tier_scenario
    from kvtransit.harness.studies.candidates.rows import RowContext
    from kvtransit.harness.studies.sweep.plan import preset

    sample = Path("tests/data/smollm2_kv_sample.npz")
    ctx = RowContext("kv-tier-fetch", Unknowns(module_budget=3.96, precision_bits=6, link="eth-25g"), tmp_path,
                     lambda _msg: None, sample)
    scenario = tier_scenario(ctx)
    point = preset("tier-deck")[0].scenario({"compress_at": "transit"})
    tier, tier_point = TierSection.of(scenario), TierSection.of(point)
    assert (scenario.model, scenario.trace_start, tier.pool_warm, scenario.context_cap, tier.kv_pool) == \
        (point.model, point.trace_start, tier_point.pool_warm, point.context_cap, tier_point.kv_pool)
    assert (scenario.codec, scenario.compress_at) == ("freq-keep-k", "transit")
    assert (scenario.link, scenario.precision_bits, scenario.kv_sample) == ("eth-25g", 6, str(sample))
    assert scenario.module_budget_ops_per_byte == 3.96
    assert trace_path(scenario.trace).exists()  # the shipped trace, wherever the command runs


def test_an_identity_kernel_is_judged_no_kernel_whatever_its_five_tests_say():
    from kvtransit.harness.studies.candidates.verdicts import verdict_of
    from kvtransit.model.judge.five_tests import FiveTests, Judgement
    from kvtransit.model.module.budget import KernelDeclaration

    passing = FiveTests("weights", "none", tuple(Judgement(t, True, "-", "-", "passes") for t in
                                                 ("bottleneck", "operations", "budget", "precision", "placement")))
    identity = KernelDeclaration("none (lossless)", lossless=True)
    verdict, why = verdict_of(passing, (), identity)
    assert verdict == "no kernel" and "moves no byte" in why and identity.identity
    assert verdict_of(passing, (), KernelDeclaration("fp8", ratio=2.0, ops_per_byte=0.5))[0] == "candidate"


def test_a_placement_the_run_did_not_count_is_shown_as_declared_and_a_counted_one_as_measured():
    declared = next(t for t in verdict(row(streams_counted=False)).tests.tests if t.test == "placement")
    assert declared.passed is True and declared.measured == "1 stream, not counted (declared)"
    assert declared.reason.startswith("declared, not counted by the run") and declared.values["declared_only"]
    assert declared.values["basis"] == "declared"
    counted = next(t for t in verdict(row()).tests.tests if t.test == "placement")
    assert counted.measured == "declared 1, measured 1.00 (measured)" and "declared_only" not in counted.values
    assert counted.values["basis"] == "measured"
    # A run that failed counts nothing: not measured, whatever was declared (fail closed).
    failed = next(t for t in verdict(row(streams=None, streams_counted=False)).tests.tests if t.test == "placement")
    assert failed.passed is None
