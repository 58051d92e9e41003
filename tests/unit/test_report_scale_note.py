"""The report and `kvtransit up` say what is real and what is scaled, and warn of an overload before the run."""

from __future__ import annotations

from kvtransit.cli.up import run_preamble
from kvtransit.model.scenario import Scenario
from kvtransit.report.text import headline, offered_load_line, scale_note, to_markdown


def _report(scenario: Scenario, workload: dict | None = None) -> dict:
    return {"requests": {"total": 1, "ok": 1, "slo_miss": 0, "failed": 0, "failed_reasons": {}},
            "slo_attainment": 1.0, "goodput_rps": 1.0, "config": scenario.describe(), "workload": workload or {},
            "link": {"configured_Bps": 1.0, "achieved_Bps": 1.0, "busy": 0.1, "kv_bytes": 1.0, "wire_bytes": 1.0},
            "energy_j": {"link": 1.0, "module": 0.0, "gpu": 1.0}, "j_per_token": 1.0,
            "accuracy": {"codec": "none", "sampled_requests": 0, "k_relative_error": None, "v_relative_error": None},
            "faithful": True, "fidelity": {},
            "ttft_s": dict.fromkeys(("mean", "p50", "p90", "p99", "max")),
            "tpot_s": dict.fromkeys(("mean", "p50", "p90", "p99", "max")),
            "itl_s": dict.fromkeys(("mean", "p50", "p90", "p99", "max")),
            "e2e_s": dict.fromkeys(("mean", "p50", "p90", "p99", "max")),
            "handoff_s": dict.fromkeys(("mean", "p50", "p90", "p99", "max"))}


def test_the_headline_says_the_cut_axis_synthetic_content_and_full_size_bytes():
    lines = headline(_report(Scenario()))  # scale auto on eth-25g: 16 of llama3-8b's 1024 channels
    note = next(line for line in lines if line.startswith("scale "))
    assert "1.56 % of its real KV bytes" in note and "16 of 1024 KV channels a layer" in note
    assert "every token and all 32 layers kept" in note and "KV content synthetic" in note
    assert "bytes and energy reported at full size (measured bytes ×64)" in note
    markdown = to_markdown(_report(Scenario()))
    assert "(synthetic KV)" in markdown and note in markdown


def test_the_headline_names_a_real_kv_sample_and_the_dilation():
    note = scale_note(Scenario(scale=1.0, dilation=62.5, kv_sample="tests/data/smollm2_kv_sample.npz").describe())
    assert note is not None and note.startswith("scale 1: each request carries its real KV bytes")
    assert "real sample tests/data/smollm2_kv_sample.npz" in note and "dilation 62.5" in note


def test_a_report_without_derived_config_has_no_scale_line():
    assert scale_note({"link": "eth-25g"}) is None and offered_load_line({}) is None


def test_the_headline_says_the_offered_load_and_an_overload():
    workload = {"offered_vs_capacity": {"offered_rps": 55.3, "utilisation": {"prefill": 10.2, "decode": 7.6,
                                                                             "link": 6.8},
                                        "bottleneck": "prefill", "overloaded": True}}
    line = next(x for x in headline(_report(Scenario(), workload)) if x.startswith("offered load"))
    assert "55.3 req/s" in line and "prefill 1020%" in line and "OVERLOADED" in line


def test_up_warns_before_it_starts_when_the_workload_overloads_the_model(tmp_path):
    trace = tmp_path / "burst.jsonl"  # 200 requests of 6,000 tokens, 60 a second (a trace compressed twentyfold)
    trace.write_text("".join(f'{{"timestamp": {i * 1000 // 60}, "input_length": 6000, "output_length": 350, '
                             f'"hash_ids": []}}\n' for i in range(200)))
    lines = run_preamble(Scenario(trace=str(trace), requests=200))
    assert lines[0].startswith("scale 0.01562: ") and lines[1].startswith("real size: --scale 1 --dilation 62.5")
    assert lines[-1].startswith("WARNING: overloaded: ") and "prefill" in lines[-1]
    assert not any(line.startswith("WARNING") for line in run_preamble(Scenario()))


def test_the_report_records_the_offered_load_it_warned_with():
    from kvtransit.report.build import build_report

    scenario = Scenario(requests=10)
    report = build_report(scenario, [], [], run_wall_s=1.0, tokens_delivered=0)
    check = report["workload"]["offered_vs_capacity"]
    assert check["requests"] == 10 and check["overloaded"] is False and set(check["utilisation"]) == {
        "prefill", "decode", "link"}


def test_the_headline_says_when_tokens_overtook_an_earlier_one():
    report = _report(Scenario())
    assert not any("overtook" in x or "arrived before" in x for x in headline(report))
    report["run"] = {"tokens_overtaking": 2}
    (line,) = [x for x in headline(report) if "arrived before an earlier token" in x]
    assert line.startswith("2 token(s)") and "held and delivered in order" in line
