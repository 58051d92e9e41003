"""The run report's `verdict` block (the KV hand-off's five tests, docs/reference.md §8) and `kvtransit verdict` on
saved
reports: built from per-request records and agent /stats, recomputed from the report's own fields, bad input."""

from __future__ import annotations

import json

import pytest

from kvtransit.cli import main
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import build_report, handoff_verdict, write_report
from kvtransit.report.text import headline, to_markdown

SCENARIO = Scenario(codec="freq-keep-k", compress_at="transit", scale=0.0625)


def _record(rid: int) -> RequestRecord:
    # Arrival at rid s, first token 60 ms later, 5 tokens 100 ms apart (E2E 460 ms), KV ready 86 ms after the first
    # token, admitted 10 ms later: (86 + 10) / 460 = 20.9 % of E2E.
    first = rid + 0.06
    return RequestRecord(rid, float(rid), 2048, 5, [first + k * 0.1 for k in range(5)], first + 0.086,
                         decode_wait_s=0.010)


def _stats(*, k=0.26, v=0.61, baseline=True, transit_bound=0):
    decode = {"role": "decode", "name": "decode-0", "gpu_energy_j": 1.0,
              "link": {"wire_bytes": 8e6, "raw_bytes": 16e6, "busy_s": 0.8, "transfers": 10},
              "accuracy": {"sampled_requests": 4, "k_relative_error": k, "v_relative_error": v}}
    if baseline:
        decode["accuracy"].update(baseline_codec="fp8", baseline_k_relative_error=0.031,
                                  baseline_v_relative_error=0.029, baseline_ratio=1.88)
    middlebox = {"role": "middlebox", "name": "middlebox", "module_energy_j": 0.0, "frames_in": 320,
                 "frames_out": 320, "transit_bound_frames": transit_bound}
    return [decode, middlebox]


def _report(scenario=SCENARIO, **stats):
    records = [_record(i) for i in range(10)]
    return build_report(scenario, records, _stats(**stats), run_wall_s=10.0, tokens_delivered=50)


def _tests(report) -> dict:
    return {t["test"]: t for t in report["verdict"]["tests"]}


def test_a_report_from_request_records_carries_the_five_tests_judged_on_what_it_measured():
    report = _report()
    verdict = report["verdict"]
    assert verdict["flow"] == "kv-handoff" and verdict["kernel"] == "freq-keep-k"
    assert verdict["measured_at"] == {"scale": SCENARIO.effective_scale, "dilation": 1.0}
    tests = _tests(report)
    assert tests["bottleneck"]["values"]["share"] == pytest.approx(report["kv_wait_share"])
    assert report["kv_wait_share"] == pytest.approx(0.096 / 0.46)
    assert tests["bottleneck"]["passed"] is True and tests["operations"]["passed"] is True
    assert tests["budget"]["passed"] is True and tests["placement"]["passed"] is True
    # Band-keep's error is far worse than fp8's at equal bytes on the same tensors: not a candidate.
    assert tests["precision"]["passed"] is False and "V 0.61 > 0.029" in tests["precision"]["reason"]
    assert verdict["verdict"] == "not a candidate: precision"
    assert report["accuracy"]["baseline_codec"] == "fp8" and report["accuracy"]["baseline_k_relative_error"] == 0.031
    lines = headline(report)
    assert any(line.startswith("five tests (kv-handoff, freq-keep-k, measured at scale 0.0625, dilation 1): "
                               "not a candidate: precision") for line in lines)
    assert "equal-bytes baseline fp8" in to_markdown(report)


def test_the_verdict_is_the_same_when_recomputed_from_the_reports_own_fields():
    report = json.loads(json.dumps(_report(transit_bound=5)))
    assert handoff_verdict(report) == report["verdict"]
    assert _tests(report)["budget"]["passed"] is False  # 5 of 320 frames were transit-bound


def test_a_run_without_a_codec_or_with_it_on_the_gpu_has_no_kernel_on_the_link():
    none = _report(Scenario(codec="none", scale=0.0625), k=0.0, v=0.0, baseline=False)
    assert none["verdict"]["verdict"] == "no kernel" and none["verdict"]["kernel"] is None
    assert _tests(none)["precision"]["reason"] == "no kernel on this link (codec none)"
    gpu = _report(Scenario(codec="freq-keep-k", compress_at="gpu", scale=0.0625))
    assert gpu["verdict"]["verdict"] == "no kernel" and "runs at the gpu" in _tests(gpu)["operations"]["reason"]


def test_a_decode_without_the_baseline_leaves_precision_not_measured():
    report = _report(baseline=False)
    assert _tests(report)["precision"]["passed"] is None
    assert "precision (not measured)" in report["verdict"]["verdict"]


def test_cli_prints_each_reports_five_tests_with_the_scale(tmp_path, capsys):
    path, _ = write_report(_report(), tmp_path / "r.json", figures=False)  # the verdict reads the JSON only
    assert main(["verdict", str(path)]) == 0
    out = capsys.readouterr().out
    assert "scale 0.0625, dilation 1" in out and "verdict: not a candidate: precision" in out
    for test in ("bottleneck", "operations", "budget", "precision", "placement"):
        assert test in out
    assert main(["verdict", str(path), str(path), "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert len(entries) == 2 and entries[0]["scale"] == 0.0625 and entries[0]["verdict"] == "not a candidate: precision"


def test_cli_computes_the_verdict_of_a_report_written_before_the_block(tmp_path, capsys):
    report = _report()
    expected = report.pop("verdict")
    (tmp_path / "old.json").write_text(json.dumps(report))
    assert main(["verdict", str(tmp_path / "old.json"), "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["verdict"] == expected["verdict"] and entry["tests"] == json.loads(json.dumps(expected["tests"]))


def test_cli_names_the_file_and_what_is_wrong_in_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert main(["verdict", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"kvtransit verdict: error: {missing}: no such file"
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert main(["verdict", str(garbage)]) == 2
    assert f"{garbage}: not a run report (not JSON" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1, 2]")
    assert main(["verdict", str(tmp_path / "list.json")]) == 2
    assert "not a run report (no 'config' block)" in capsys.readouterr().err
    report = _report()
    del report["verdict"], report["accuracy"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(report))
    assert main(["verdict", str(old)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{old}: no 'verdict' block, and it cannot be computed: no 'accuracy'" in err
