"""The candidate table as a map: what each cell rests on, the verdicts "exists" and "not settled", the task-level
precision, CKKS's own declaration, the switch's sum on real-shaped partials, regimes (grid, frontier, live points,
the seam), the break-even module, the deck's column and the evidence files. Hand-made rows; no process starts."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kvtransit.harness.studies.candidates.regimes import (
    Axis,
    PointModel,
    Regime,
    confirm,
    confirmation_points,
    map_regime,
    where_text,
)
from kvtransit.harness.studies.candidates.rows import RowContext, RowRun, small_report
from kvtransit.harness.studies.candidates.table import (
    CANDIDATE,
    EXISTS,
    LINE_INPUT,
    NOT_A_CANDIDATE,
    NOT_SETTLED,
    PrecisionFigure,
    RowMeasured,
    Unknowns,
    judge_row,
)
from kvtransit.harness.studies.candidates.verdicts import against_deck, judge_one
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.five_tests import (
    BOTTLENECK_MIN_SHARE,
    PrecisionMeasured,
    share_at,
    with_basis,
)
from kvtransit.model.judge.task_accuracy import MeasuredTaskLoss
from kvtransit.model.module.budget import KernelDeclaration
from kvtransit.paths import REPO

SIM = Unknowns()
MAC = KernelDeclaration("mac-1", ratio=4.0, ops_per_byte=1.0, op_types=frozenset({"mac"}))
EXACT = PrecisionFigure(0.0, 0.0, "values not returned exactly", required_bits=12)


def row(**fields) -> RowMeasured:
    base = dict(name="hand-made", decl=MAC, share=0.4, share_of="made-up share", link="eth-25g", link_bytes=1e8,
                line=LINE_INPUT, precision=EXACT, streams=1.0)
    return RowMeasured(**(base | fields))


def judged(r: RowMeasured, name: str, u: Unknowns = SIM):
    return next(t for t in judge_row(r, u).tests if t.test == name)


# --- what each cell rests on ----------------------------------------------------------------------------------------

def test_every_figure_is_tagged_with_what_it_rests_on():
    bottleneck, operations, budget, precision, placement = judge_row(row(), SIM).tests
    assert bottleneck.measured == "40.0% of E2E (measured)" and bottleneck.values["basis"] == "measured"
    assert operations.measured.endswith("(declared)") and budget.measured.endswith("(declared)")
    assert budget.values["basis"] == "declared"  # no frames counted: the declaration's arithmetic
    assert precision.values["basis"] == "measured" and placement.values["basis"] == "measured"


def test_a_share_with_a_modelled_factor_is_tagged_so_and_a_modelled_one_modelled():
    mixed = judged(row(share_factor="the all-to-all's part is the model's"), "bottleneck")
    assert mixed.measured.endswith("(measured × modelled)") and "the all-to-all's part" in mixed.reason
    modelled = judged(row(share_modelled=True), "bottleneck")
    assert modelled.measured.endswith("(modelled)") and modelled.values["basis"] == "modelled"
    # A measured share moved to another link is the link model's rescale of a measurement: never plain measured.
    moved = judged(row(), "bottleneck", Unknowns(link="eth-100g"))
    assert moved.values["basis"] == "measured × modelled" and not moved.measured.endswith("(measured)")


def test_a_budget_with_counted_frames_says_which_part_is_declared_and_which_measured():
    counted = judged(row(frames=40, transit_bound_frames=0, budget_ops_per_byte=SIM.module_budget,
                       decl=replace(MAC, ratio=1.0)), "budget")
    assert counted.measured == "1.00 ops/line B (declared); 0 of 40 frames transit-bound (measured)"
    assert counted.values["basis"] == "measured"


def test_with_basis_refuses_an_unknown_source_and_never_tags_twice():
    operations = judged(row(), "operations")
    assert with_basis(operations, "declared").measured == operations.measured
    with pytest.raises(ValueError, match="basis must be one of"):
        with_basis(operations, "guessed")


# --- the compute basis and the share's sensitivity to it ------------------------------------------------------

def test_the_share_at_a_third_and_three_times_the_time_that_is_not_the_links():
    assert share_at(0.5, 1.0) == 0.5
    assert share_at(0.5, 3.0) == pytest.approx(0.25) and share_at(0.5, 1 / 3) == pytest.approx(0.75)
    assert share_at(0.0, 3.0) == 0.0
    with pytest.raises(ValueError, match="factor must be a finite number > 0"):
        share_at(0.5, 0.0)


def test_the_bottleneck_says_when_its_verdict_turns_on_the_compute_basis():
    near = judged(row(share=0.12, compute_basis="modelled: a GPU"), "bottleneck")
    sens = near.values["sensitivity"]
    assert set(sens) == {"0.3", "1", "3"} and sens["1"] == pytest.approx(0.12)
    assert sens["3"] < BOTTLENECK_MIN_SHARE <= sens["0.3"] and near.values["holds_across_compute"] is False
    assert "turns on it" in near.reason and "modelled: a GPU" in near.reason
    far = judged(row(share=0.9), "bottleneck")
    assert far.values["holds_across_compute"] is True


# --- exists, not settled --------------------------------------------------------------------------------------

def test_a_row_that_passes_all_five_where_an_incumbent_does_the_job_exists():
    v = judge_one(row(incumbent="NVLink SHARP sums in the switch"), SIM)
    assert v.verdict == EXISTS and "NVLink SHARP" in v.why
    failing = judge_one(row(incumbent="NVLink SHARP", share=0.01, link_bytes=None), SIM)
    assert failing.verdict == NOT_A_CANDIDATE  # an incumbent does not make a failing row anything else


def test_a_row_whose_live_run_was_not_faithful_is_not_settled_and_not_judged():
    v = judge_one(row(unsettled="its run was not faithful (timers 9 % late)"), SIM)
    assert v.verdict == NOT_SETTLED and "timers 9 % late" in v.why and v.flips == ()
    assert v.tests is not None and all(t.passed for t in v.tests.tests)  # shown, not judged


def test_which_tests_rest_on_what_is_said_in_the_verdict():
    v = judge_one(row(streams_counted=False), SIM)
    assert v.rests_on == "measured: bottleneck, precision; declared: operations, budget, placement"


# --- precision by what a model does -----------------------------------------------------------------------------

BAND_KEEP = KernelDeclaration("freq-keep-k", ratio=2.0, op_types=frozenset({"fft"}), transform_charged=False,
                              transform_length=64, transform="dct")


def loss(increase: float, bits: str = "none") -> MeasuredTaskLoss:
    return MeasuredTaskLoss(f"freq-keep-k precision_bits={bits}", 10.0, 10.0 * (1 + increase), increase, 0.35, 0.75,
                            1024, "SmolLM2 (accuracy.json)")


def test_a_kv_rows_precision_is_its_task_level_loss_with_the_tensor_error_as_context():
    tensor = PrecisionMeasured(4, 0.3, 0.5, "fp8", 0.025, 0.025, 1.88)
    r = row(decl=BAND_KEEP, precision=None, task_losses={"exact": loss(0.78), "8": loss(0.005, "8")},
            precision_measured=tensor)
    exact = judged(r, "precision")
    assert exact.passed is False and exact.measured.startswith("ppl +78.00%")
    assert "context, not judged: the equal-bytes baseline fp8's K 0.025" in exact.reason
    at_8 = judged(r, "precision", Unknowns(precision_bits=8))
    assert at_8.passed is True  # its own measured loss at 8 bits
    at_5 = judged(r, "precision", Unknowns(precision_bits=5))
    assert at_5.passed is None and "no task-level loss measured" in at_5.reason


# --- CKKS's own declaration -----------------------------------------------------------------------------------

def test_the_ckks_key_switch_is_counted_at_the_runs_parameters():
    from kvtransit.flows.ciphertext.encrypted_layer import COEFF_MOD_BIT_SIZES, POLY_MODULUS_DEGREE
    from kvtransit.model.module import ckks

    assert (POLY_MODULUS_DEGREE, tuple(COEFF_MOD_BIT_SIZES)) == (ckks.RING_DEGREE, ckks.COEFF_MOD_BITS)
    count = ckks.key_switch_count()
    assert (count.level, count.forward_ntts, count.inverse_ntts) == (3, 15, 5)
    assert count.ntt_ops == 20 * 4096 * 13 * 3 and count.other_ops == 704_512 and count.total == 3_899_392
    assert count.ciphertext_bytes == 2 * 8192 * 140 // 8 == 286_720
    assert ckks.declaration().ops_per_byte == pytest.approx(13.6)
    assert ckks.declaration(False).ops_per_byte == pytest.approx(704_512 / 286_720)
    assert ckks.key_bytes() == 3 * 2 * 4 * 8192 * 8
    assert not ckks.declaration().identity and ckks.declaration().ratio == 1.0


def test_required_bits_follow_one_rule_for_both_modular_kernels():
    from kvtransit.kernels import ntt
    from kvtransit.model.module.ckks import key_switch_count, required_bits

    assert required_bits([(ntt.Q - 1).bit_length()]) == ((ntt.Q - 1) ** 2).bit_length() == 24
    assert required_bits([60, 40, 40, 60]) == 120
    with pytest.raises(ConfigError, match="power of two"):
        key_switch_count(n=1000)


# --- the switch's sum on partials, against float64 ----------------------------------------------------------

def test_the_switchs_sum_is_no_further_from_float64_than_ncclss_ring_on_the_same_partials():
    from kvtransit.flows.tp.sum_accuracy import ring_sum, sum_errors

    rng = np.random.default_rng(1)
    exact = rng.standard_normal((64, 96))
    shares = [exact / 4 + rng.standard_normal(exact.shape) * 0.3 for _ in range(3)]
    partials = [s.astype(ml_dtypes.bfloat16) for s in [*shares, exact - sum(shares)]]
    e = sum_errors([(partials, exact)], 4, "synthetic")
    assert 0 < e.switch < e.ring and e.switch < 2 ** -8  # one rounding against three
    two = sum_errors([(partials[:2], exact)], 2, "synthetic")
    assert two.switch == two.ring  # two streams: one add, rounded once, both ways
    assert ring_sum(partials).dtype == partials[0].dtype


# --- regimes ----------------------------------------------------------------------------------------------------

def _run(share: float | None, *, faithful: str = "yes", decl: KernelDeclaration = MAC,
         name: str = "hand-made") -> RowRun:
    return RowRun(row(name=name, share=share, decl=decl), 0.01, 2.0, faithful, "made-up command", None)


def _regime(**kw) -> Regime:
    def evaluate(_ctx, _own, x, y):
        share = x * {"fast": 1.0, "slow": 2.0}.get(y, y) / 100
        return PointModel(share, {"bottleneck": share >= BOTTLENECK_MIN_SHARE})
    fields = dict(x=Axis("rate", "load (req/s)", (2.0, 4.0, 8.0, 16.0), "req/s"),
                  y=Axis("link", "link", ("fast", "slow"), choices=("fast", "slow")), evaluate=evaluate,
                  model="x·y/100", home=lambda ctx: (float(ctx.setting("rate", 4.0)), ctx.point.get("link", "slow")))
    return Regime(**(fields | kw))


def _ctx(tmp_path: Path) -> RowContext:
    return RowContext("hand-made", SIM, tmp_path, lambda _m: None, Path("unused.npz"))


def test_the_map_finds_where_all_five_pass_and_the_frontier_nearest_the_rows_own_point(tmp_path):
    own = _run(0.04)
    mapped = map_regime(_regime(y=Axis("link", "link", (1.0, 2.0), "x")), _ctx(tmp_path), own, judge_one(own.measured,
                                                                                                         SIM))
    # shares: y=1: 2, 4, 8, 16 %; y=2: 4, 8, 16, 32 %
    assert [[p.passes for p in r] for r in mapped.grid] == [[False, False, False, True], [False, False, True, True]]
    assert mapped.decides == "all five"
    assert confirmation_points(mapped, (4.0, 1.0)) in ([(8.0, 1.0), (16.0, 1.0)], [(4.0, 2.0), (8.0, 2.0)])
    assert where_text(mapped) == "passes all five on 1 x at >= ~16 req/s; 2 x at >= ~8 req/s"


def test_a_test_that_fails_everywhere_leaves_the_kernel_nowhere_and_the_bottleneck_its_frontier(tmp_path):
    own = _run(0.04, decl=replace(MAC, op_types=frozenset({"rounding"})))
    mapped = map_regime(_regime(), _ctx(tmp_path), own, judge_one(own.measured, SIM))
    assert mapped.fixed_failing == ("operations",) and mapped.decides == "bottleneck" and mapped.frontier
    text = where_text(mapped)
    assert text.startswith("nowhere on the grid (operations fails at every point); link-bound (bottleneck passes) on")


def test_live_points_straddle_the_frontier_reuse_the_rows_own_run_and_add_one_where_model_and_live_disagree(tmp_path):
    ctx = replace(_ctx(tmp_path), point={"rate": 8.0, "link": "fast"})
    own = _run(0.08)
    mapped = map_regime(_regime(y=Axis("link", "link", ("fast",), choices=("fast",)),
                                evaluate=lambda _c, _o, x, _y: PointModel(x / 100, {"bottleneck": x >= 10})),
                        ctx, own, judge_one(own.measured, SIM))
    asked = []

    def run_row(point_ctx):  # the live run at 16 req/s says the model is wrong there; 2 req/s is as modelled
        asked.append(point_ctx.point["rate"])
        return _run({16.0: 0.05, 4.0: 0.04, 2.0: 0.02}[point_ctx.point["rate"]])

    confirm(mapped, ctx, own, judge_one(own.measured, SIM), run_row, SIM, log=lambda _m: None)
    assert asked == [16.0]  # 8 req/s is the row's own run; 16 disagrees, and it is the grid's edge
    own_point, sixteen = mapped.live
    assert own_point.own and own_point.agrees(("bottleneck",)) is True
    assert sixteen.agrees(("bottleneck",)) is False and sixteen.label == "rate-16req-s_link-fast"
    assert mapped.unsettled is None and "2 live points, 1 as modelled" in mapped.where


def test_a_live_point_that_was_not_faithful_leaves_the_row_not_settled(tmp_path):
    ctx = _ctx(tmp_path)
    own = _run(0.04)
    mapped = map_regime(_regime(), ctx, own, judge_one(own.measured, SIM))
    confirm(mapped, ctx, own, judge_one(own.measured, SIM),
            lambda _c: _run(0.3, faithful="NO (timers 12 % late)"), SIM, log=lambda _m: None)
    assert mapped.unsettled and "not faithful (NO (timers 12 % late))" in mapped.unsettled


def test_an_axis_outside_its_catalogue_is_one_line_naming_it():
    regime = _regime()
    with pytest.raises(ConfigError, match=r"regime axis 'link': 'eth-400g' is not in the catalogue \(choose from: "):
        regime.with_values("link", ("eth-400g",))
    with pytest.raises(ConfigError, match="'rate': -2 is not a number > 0"):
        regime.with_values("rate", (-2,))
    with pytest.raises(ConfigError, match="axis 'batch' is not this row's"):
        regime.with_values("batch", (1,))


@pytest.mark.parametrize("spec,message", [
    ("kv-handof:rate=4", "unknown candidate 'kv-handof'"),
    ("kv-handoff:batch=4", "kv-handoff's axes are rate and link, not 'batch'"),
    ("kv-handoff:link=eth-400g", "'eth-400g' is not in the catalogue"),
    ("kv-handoff:rate=fast", "'fast' is not a number"),
    ("kv-handoff=4", "expected ROW:KEY=V1,V2"),
    ("tp-all-reduce:tp=2,4", "tp-all-reduce is not among the rows run"),
])
def test_a_bad_regime_axis_is_one_line_naming_it(spec, message):
    from kvtransit.harness.studies.candidates.run import parse_axes

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_axes([spec], ("kv-handoff",))


def test_every_row_has_a_regime_and_a_deck_verdict_and_its_home_on_its_own_axes(tmp_path):
    from kvtransit.harness.studies.candidates.rows import all_rows

    for name, r in all_rows().items():
        assert r.deck is not None and r.regime is not None and r.spec is not None, name
        ctx = RowContext(name, SIM, tmp_path, lambda _m: None, Path("unused.npz"))
        x, y = r.regime.home(ctx)
        assert x in r.regime.x.values and y in r.regime.y.values, (name, x, y)


def test_the_hand_off_regime_runs_the_rows_scenario_on_the_twin():
    from kvtransit.harness.studies.candidates.kv_rows import handoff_model
    from kvtransit.harness.studies.candidates.run import default_sample_path

    ctx = RowContext("kv-handoff", SIM, Path("/nonexistent"), lambda _m: None, default_sample_path())
    slow, fast = handoff_model(ctx, None, 14.0, "eth-25g"), handoff_model(ctx, None, 14.0, "nvlink4")
    assert slow.share > fast.share and fast.passed == {"bottleneck": False}


# --- the break-even module --------------------------------------------------------------------------------------

def test_a_ratio_below_the_faster_links_bandwidth_ratio_has_no_break_even_time():
    from kvtransit.harness.studies.candidates.kv_rows import ACCURACY_RESULTS
    from kvtransit.harness.studies.candidates.spec import break_even, codec_case

    be = break_even("kv-handoff", codec_case("a hand-off", "llama3-8b", 2048, "eth-25g", bits_from=ACCURACY_RESULTS))
    assert be.case.faster == "eth-100g" and be.ops_per_line_byte is None and be.latency_s is None
    assert "would have to reach ~4" in be.why_none["ops"] and be.at_sim is False
    # At equal power: the module may spend what a quarter of the wire energy saves (15 pJ/bit link, ratio 2,
    # two stages over 1.5 × the input bits): (15 − 7.5) / 1.5 = 5 pJ/bit.
    assert be.pj_per_bit == pytest.approx(5.0)


def test_a_kernel_that_beats_both_has_a_break_even_on_every_figure():
    from kvtransit.flows.tp.rows import tp_spec
    from kvtransit.harness.studies.candidates.spec import ModuleSpec, break_even, meets

    be = break_even("tp-all-reduce", tp_spec())
    assert be.ops_per_line_byte == pytest.approx(0.5) and be.latency_s > 1e-6 and be.pj_per_bit > 1.0
    assert be.at_sim is True and meets(be, ModuleSpec()) == "yes"
    slow = ModuleSpec(latency_s=be.latency_s * 2)
    assert meets(be, slow) == "no (latency)"


@pytest.mark.parametrize("fields,message", [
    ({"pj_per_bit": -1.0}, "--module-pj-per-bit must be a number >= 0, got -1.0"),
    ({"latency_s": -1e-6}, "--module-latency-us must be a number >= 0"),
    ({"ops_per_line_byte": 0.0}, "--module-budget must be a number of ops per line byte > 0"),
    ({"pj_per_bit": math.nan}, "--module-pj-per-bit must be a number >= 0, got nan"),
])
def test_a_negative_module_spec_is_one_line_naming_it(fields, message):
    from kvtransit.harness.studies.candidates.spec import ModuleSpec

    with pytest.raises(ConfigError, match=re.escape(message)):
        ModuleSpec(**fields)


# --- the deck beside the measurement --------------------------------------------------------------------------

def test_where_the_deck_differs_the_deciding_figure_is_the_failing_tests():
    agreeing = judge_one(row(), SIM)
    assert agreeing.verdict == CANDIDATE and against_deck(agreeing, CANDIDATE) is None
    failing = judge_one(row(share=0.05, link_bytes=None), SIM)
    assert against_deck(failing, CANDIDATE) == "bottleneck: 5.0% of E2E (measured) against >= 10.0%"
    exists = judge_one(row(incumbent="NVLink SHARP"), SIM)
    assert against_deck(exists, CANDIDATE) == "an incumbent does the job: NVLink SHARP"
    assert against_deck(agreeing, NOT_A_CANDIDATE).startswith("all five pass: bottleneck 40.0% of E2E")


# --- evidence -------------------------------------------------------------------------------------------------

def test_a_rows_evidence_is_its_small_report_not_its_ledgers():
    report = {"kv_wait_share": 0.08, "per_request": [{"id": i} for i in range(40)], "steps": list(range(100)),
              "link": {"busy": 0.1, "lanes": [1, 2]}}
    small = small_report(report)
    assert "per_request" not in small and small["steps"] == "(100 entries: in the run's directory)"
    assert small["link"] == {"busy": 0.1, "lanes": [1, 2]} and small["kv_wait_share"] == 0.08


def _links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", markdown)


def test_every_link_of_a_written_table_resolves_to_a_file_or_a_section(tmp_path):
    from kvtransit.harness.studies.candidates.report import anchor, write_table

    own = _run(0.4, name="kv-handoff")  # a real row's name: the deck's column reads the catalogue
    mapped = map_regime(_regime(), _ctx(tmp_path), own, judge_one(own.measured, SIM))
    confirm(mapped, _ctx(tmp_path), own, judge_one(own.measured, SIM), lambda _c: _run(0.2), SIM,
            log=lambda _m: None)
    own.regime = mapped
    runs, verdicts = [own], [judge_one(own.measured, SIM)]
    out = tmp_path / "table"
    stale = out / "candidates" / "kv-handoff" / "points" / "an-earlier-runs-point.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    write_table(out, verdicts, runs, SIM, "kvtransit candidates --only kv-handoff", wall_s=12.0, spec=[])
    assert not stale.exists()  # a row's evidence is this run's only
    markdown = (out / "candidates.md").read_text()
    table = [ln for ln in markdown.splitlines() if ln.startswith("| [kv-handoff]")]
    assert len(table) == 1 and table[0].count("](candidates/kv-handoff/row.json)") == 6
    files = [link for link in _links(markdown) if not link.startswith("../")]
    assert files and all((out / link).exists() for link in files), files
    up = [link for link in _links(markdown) if link.startswith("../")]
    assert all((REPO / "docs" / link.removeprefix("../")).exists() for link in up)
    headings = {anchor(line.lstrip("# ")) for line in markdown.splitlines() if line.startswith("### ")}
    assert set(re.findall(r"\]\(#([^)]+)\)", markdown)) <= headings
    row_json = json.loads((out / "candidates" / "kv-handoff" / "row.json").read_text())
    assert row_json["regime"]["live"] and row_json["deck"]["verdict"] == "promising"


def test_the_committed_tables_links_all_resolve():
    """docs/results/candidates.md: every link is a file in the repository or a section of the table."""
    from kvtransit.harness.studies.candidates.report import anchor

    results = REPO / "docs" / "results"
    markdown = (results / "candidates.md").read_text()
    missing = [link for link in _links(markdown) if not (results / link).exists()]
    assert not missing, missing
    headings = {anchor(line.lstrip("# ")) for line in markdown.splitlines() if line.startswith("#")}
    assert set(re.findall(r"\]\(#([^)]+)\)", markdown)) <= headings
    assert "](candidates/" in markdown  # the cells point at the committed evidence
