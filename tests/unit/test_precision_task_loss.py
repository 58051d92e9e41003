"""The precision test judged by a measured task-level loss: a real model's perplexity increase over the
kernel's codec'd cache, read from an end-to-end results file, against a 1 % tolerance; without one, today's
tensor-error rule, and the reason says so. Results files here are small hand-written ones in the real schema."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvtransit.cli import main
from kvtransit.model.catalog.codecs import codec_declaration
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.five_tests import NO_TASK_LOSS, PrecisionMeasured, judge_handoff, precision_test
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.judge.task_accuracy import (
    PPL_INCREASE_TOLERANCE,
    RESULTS_KIND,
    RESULTS_VERSION,
    MeasuredTaskLoss,
    codec_key,
    task_loss_from_results,
)
from kvtransit.model.module.budget import KernelDeclaration
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import build_report, write_report

BAND_KEEP = codec_declaration("freq-keep-k", keep=0.5, transform_length=64)
BAND_KEEP_KEY = codec_key("freq-keep-k", keep=0.5, block=64, sinks=4, variant="dct")
# Band-keep beats fp8 on the run's tensors here, so without a task-level loss precision passes.
TENSORS = PrecisionMeasured(8, 0.02, 0.025, "fp8", 0.03, 0.03, 1.88)


def _row(key: str, increase: float, **extra) -> dict:
    return {"key": key, "ppl_exact": 20.0, "ppl": 20.0 * (1 + increase), "ppl_increase": increase,
            "ppl_increase_worst_text": increase, "kl": 0.01, "top1": 0.97, "tokens": 1024, **extra}


def _results(*rows: dict) -> dict:
    return {"kind": RESULTS_KIND, "version": RESULTS_VERSION, "source": "SmolLM2-135M-Instruct, 4 windows",
            "rows": list(rows)}


def _loss(increase: float) -> MeasuredTaskLoss:
    loss = task_loss_from_results(_results(_row(BAND_KEEP_KEY, increase)), BAND_KEEP_KEY, where="r.json")
    assert loss is not None
    return loss


def test_the_key_names_every_parameter_that_changes_a_band_keep_codecs_output():
    assert BAND_KEEP_KEY == "freq-keep-k variant=dct keep=0.5 block=64 sinks=4 precision_bits=none keys=post-rope"
    assert codec_key("freq-keep-k", keep=0.5, block=64, sinks=4, variant="dct", precision_bits=8) != BAND_KEEP_KEY
    with pytest.raises(ConfigError, match="needs keep, block, sinks and variant"):
        codec_key("freq-keep-k", keep=0.5)


def test_a_results_file_gives_the_row_of_the_key_or_none():
    results = _results(_row("fp8 block=64", 0.006), _row(BAND_KEEP_KEY, 0.37))
    loss = task_loss_from_results(results, BAND_KEEP_KEY, where="r.json")
    assert loss is not None and loss.ppl_increase == 0.37 and loss.tokens == 1024 and not loss.within_tolerance
    assert loss.source == "SmolLM2-135M-Instruct, 4 windows (r.json)"
    assert task_loss_from_results(results, "kivi-2", where="r.json") is None


@pytest.mark.parametrize("results, says", [
    ({"kind": "something else"}, "not an end-to-end accuracy results file"),
    ({"kind": RESULTS_KIND, "version": 99, "rows": []}, "results version 99"),
    ({"kind": RESULTS_KIND, "version": RESULTS_VERSION}, "no \"rows\" list"),
    (_results({**_row(BAND_KEEP_KEY, 0.1), "ppl_increase_worst_text": float("nan")}),
     "ppl_increase_worst_text must be a finite number"),
    (_results(_row(BAND_KEEP_KEY, 0.1, tokens=0)), "tokens must be a whole number >= 1"),
])
def test_a_malformed_results_file_is_a_one_line_error_naming_it(results, says):
    with pytest.raises(ConfigError, match=r"^r\.json: ") as info:
        task_loss_from_results(results, BAND_KEEP_KEY, where="r.json")
    assert says in str(info.value)


def test_precision_passes_at_most_one_percent_perplexity_increase_and_fails_above():
    assert PPL_INCREASE_TOLERANCE == 0.01
    within = precision_test(BAND_KEEP, TENSORS, _loss(0.01))
    assert within.passed is True and within.measured.startswith("ppl +1.00%")
    assert "within tolerance" in within.reason and "SmolLM2-135M-Instruct" in within.reason
    beyond = precision_test(BAND_KEEP, TENSORS, _loss(0.0101))
    assert beyond.passed is False and "NOT within tolerance" in beyond.reason
    # The task-level figure decides even where the tensor-error rule would pass: it is the measurement, not a proxy.
    assert precision_test(BAND_KEEP, TENSORS).passed is True
    assert precision_test(BAND_KEEP, TENSORS, _loss(0.37)).passed is False


def test_without_a_task_level_loss_precision_is_todays_rule_and_says_so():
    judged = precision_test(BAND_KEEP, replace(TENSORS, v_relative_error=0.57))
    assert judged.passed is False and "V 0.57 > 0.03" in judged.reason and judged.reason.endswith(NO_TASK_LOSS)
    missing = precision_test(BAND_KEEP, TENSORS, task_note="r.json has no row for kivi-2")
    assert missing.passed is True and missing.reason.endswith("r.json has no row for kivi-2")


def test_a_lossless_kernel_is_still_judged_by_exactness():
    lossless = KernelDeclaration("ntt-identity", ratio=1.0, op_types=frozenset({"ntt"}), transform="ntt",
                                 transform_length=256, lossless=True)
    assert precision_test(lossless, PrecisionMeasured(4, 0.0, 1e-9), _loss(0.0)).passed is False


def test_the_hand_off_verdict_takes_the_task_level_loss():
    from kvtransit.model.judge.five_tests import HandoffMeasured

    measured = HandoffMeasured(kv_wait_share=0.25, link_busy=0.6, transit_bound_frames=0, frames_in=640,
                               frames_out=640, precision=TENSORS)
    assert judge_handoff(BAND_KEEP, 1.6, measured).candidate
    result = judge_handoff(BAND_KEEP, 1.6, measured, task=_loss(0.37))
    assert result.verdict == "not a candidate: precision"


# --- kvtransit verdict --accuracy-results ---------------------------------------------------------------------------

def _report_file(tmp_path, scenario: Scenario) -> str:
    records = [RequestRecord(i, float(i), 2048, 5, [i + 0.06 + k * 0.1 for k in range(5)], i + 0.146,
                             decode_wait_s=0.010) for i in range(10)]
    stats = [{"role": "decode", "name": "decode-0", "gpu_energy_j": 1.0,
              "link": {"wire_bytes": 8e6, "raw_bytes": 16e6, "busy_s": 0.8, "transfers": 10},
              "accuracy": {"sampled_requests": 4, "k_relative_error": 0.26, "v_relative_error": 0.61,
                           "baseline_codec": "fp8", "baseline_k_relative_error": 0.031,
                           "baseline_v_relative_error": 0.029, "baseline_ratio": 1.88}},
             {"role": "middlebox", "name": "middlebox", "module_energy_j": 0.0, "frames_in": 320, "frames_out": 320,
              "transit_bound_frames": 0}]
    path, _ = write_report(build_report(scenario, records, stats, run_wall_s=10.0, tokens_delivered=50),
                           tmp_path / "r.json", figures=False)  # the verdict reads the JSON only
    return str(path)


def _verdict(capsys, *argv: str) -> dict:
    assert main(["verdict", "--json", *argv]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    return entry


def test_verdict_reads_the_runs_codec_setting_from_the_results_file(tmp_path, capsys):
    report = _report_file(tmp_path, Scenario(codec="freq-keep-k", compress_at="transit", scale=0.0625))
    results = tmp_path / "accuracy.json"
    results.write_text(json.dumps(_results(_row(BAND_KEEP_KEY, 0.004), _row("fp8 block=64", 0.3))))
    before = _verdict(capsys, report)
    assert before["verdict"] == "not a candidate: precision"  # tensor error: worse than fp8 on V
    after = _verdict(capsys, "--accuracy-results", str(results), report)
    precision = next(t for t in after["tests"] if t["test"] == "precision")
    assert precision["passed"] is True and "+0.40%" in precision["reason"] and str(results) in precision["reason"]
    assert after["verdict"] == "candidate" and after["candidate"] is True
    assert [t["test"] for t in after["tests"]] == [t["test"] for t in before["tests"]]


def test_verdict_falls_back_and_says_so_when_the_file_has_no_row_for_the_runs_setting(tmp_path, capsys):
    report = _report_file(tmp_path, Scenario(codec="freq-keep-k", compress_at="transit", scale=0.0625, sinks=0))
    results = tmp_path / "accuracy.json"
    results.write_text(json.dumps(_results(_row(BAND_KEEP_KEY, 0.004))))
    entry = _verdict(capsys, "--accuracy-results", str(results), report)
    precision = next(t for t in entry["tests"] if t["test"] == "precision")
    assert precision["passed"] is False and "V 0.61 > 0.029" in precision["reason"]
    assert precision["reason"].endswith(f"{results} has no row for freq-keep-k variant=dct keep=0.5 block=64 sinks=0 "
                                        "precision_bits=none keys=post-rope: judged by tensor error against the "
                                        "equal-bytes baseline")


def test_verdict_refuses_a_results_file_that_is_not_one_in_one_line(tmp_path, capsys):
    report = _report_file(tmp_path, Scenario(codec="freq-keep-k", compress_at="transit", scale=0.0625))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "run report"}))
    assert main(["verdict", "--accuracy-results", str(bad), report]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: not an end-to-end accuracy results file" in err
    assert main(["verdict", "--accuracy-results", str(tmp_path / "none.json"), report]) == 2
    assert "none.json: no such file" in capsys.readouterr().err
