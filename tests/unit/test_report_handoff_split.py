"""The report's hand-off split: exposed and hidden parts, the streamed hand-off check decode judged, the
link figures of a streamed run, and the sweep row's exposed share (built from stats dicts, no process)."""

from __future__ import annotations

import math

import pytest

from kvtransit.harness.studies.sweep.report import markdown_tables
from kvtransit.harness.studies.sweep.runner import METRIC_COLUMNS, row_from_report
from kvtransit.model.judge import fidelity
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import build_report
from kvtransit.report.text import headline

N, PROMPT = 10, 2048
WHOLE = Scenario(codec="none", scale=0.0625, requests=N)
LAYERWISE = Scenario(codec="none", scale=0.0625, requests=N, handoff="layerwise")


def _records(handoff_s: float) -> list[RequestRecord]:
    """N requests a second apart, each hand-off `handoff_s` (KV ready − first token)."""
    return [RequestRecord(i, float(i), PROMPT, 5, [i + 0.06 + 0.2 + k * 0.01 for k in range(5)], i + 0.06 + handoff_s,
                          first_token_stamp_s=i + 0.06) for i in range(N)]


def _decode(scenario: Scenario, *, exposed_s: float, hidden_s: float, hidden_share: float,
            streamed_check: dict | None) -> dict:
    wire = float(scenario.model_spec.kv_bytes(PROMPT)) * scenario.effective_scale * N
    return {"role": "decode", "name": "decode-0", "gpu_energy_j": 1.0, "shortest_step_wall_s": 0.0062,
            "timer_lateness_mean_s": 5e-6,
            "link": {"wire_bytes": wire, "raw_bytes": wire, "transfers": N,
                     "busy_s": wire / scenario.scaled_link.bandwidth_Bps},
            "accuracy": {"sampled_requests": 0, "k_relative_error": None, "v_relative_error": None},
            "handoff_split": {"exposed_s": exposed_s * N, "hidden_s": hidden_s * N,
                              "hidden_bytes": round(wire * hidden_share), "bytes": wire, "handoffs": N},
            "streamed_handoff_model": streamed_check}


def _report(scenario: Scenario, decode: dict, handoff_s: float, *, shaper_busy: float = 0.9, **kwargs) -> dict:
    prefill = {"role": "prefill", "name": "prefill-0", "gpu_energy_j": 1.0, "shortest_step_wall_s": 0.059,
               "timer_lateness_mean_s": 5e-6}
    middlebox = {"role": "middlebox", "name": "middlebox", "wire_bytes": decode["link"]["wire_bytes"],
                 "kernel_compute_s": 0.0, "modelled_compute_s": 0.0, "module_energy_j": 0.0,
                 "link": {"busy": shaper_busy, "achieved_Bps": 1.0, "shaped_achieved_Bps": 1.0}}
    return build_report(scenario, _records(handoff_s), [prefill, decode, middlebox], run_wall_s=10.0,
                        tokens_delivered=5 * N, **kwargs)


def _check(measured: list[float], prescribed: list[float]) -> dict:
    return {"check": fidelity.handoff_gap(measured, prescribed, 1.0).as_dict(),
            "distribution": fidelity.handoff_distribution(measured, prescribed, len(measured))}


def test_a_layerwise_report_splits_the_hand_off_and_judges_the_exposed_part_by_decodes_check():
    exposed, hidden = 0.004, 0.05
    decode = _decode(LAYERWISE, exposed_s=exposed, hidden_s=hidden, hidden_share=0.95,
                     streamed_check=_check([exposed] * N, [exposed * 1.01] * N))
    report = _report(LAYERWISE, decode, exposed, handoff_splits={i: {"hidden_s": hidden} for i in range(N)})
    split = report["handoff_split"]
    assert split["handoff"] == "layerwise" and split["handoffs"] == N
    assert split["exposed_s"]["p50"] == pytest.approx(exposed)
    assert split["exposed_share"] == pytest.approx(exposed / (exposed + hidden))
    assert split["hidden_bytes_share"] == pytest.approx(0.95)
    check = report["fidelity"]["handoff_model"]
    assert check["ok"] and check["distribution"]["measured_at"] == "decode", check
    assert report["per_request"][0]["handoff_exposed_s"] == pytest.approx(exposed)
    assert report["per_request"][0]["handoff_hidden_s"] == hidden
    # A streamed run's link figures are decode's (its busy time without the waits for compute), not the shaper's.
    assert report["link"]["measured_at"] == "decode"
    assert any(line.startswith("hand-off (layerwise): exposed p50 4.00 ms") for line in headline(report))


def test_a_layerwise_run_whose_decode_judged_no_streamed_hand_off_is_not_faithful():
    decode = _decode(LAYERWISE, exposed_s=0.004, hidden_s=0.05, hidden_share=0.95, streamed_check=None)
    report = _report(LAYERWISE, decode, 0.004)
    check = report["fidelity"]["handoff_model"]
    assert not check["ok"] and check["hint"].startswith(fidelity.NOT_MEASURED) and not report["faithful"]


def test_a_layerwise_hand_off_off_the_model_fails_the_check_with_decodes_hint():
    decode = _decode(LAYERWISE, exposed_s=0.01, hidden_s=0.05, hidden_share=0.9,
                     streamed_check=_check([0.01] * N, [0.005] * N))
    check = _report(LAYERWISE, decode, 0.01)["fidelity"]["handoff_model"]
    assert not check["ok"] and check["measured"] == pytest.approx(1.0) and "2.000x the model" in check["hint"]


def test_a_whole_report_hides_nothing_and_keeps_the_shapers_link_figures():
    decode = _decode(WHOLE, exposed_s=0.09, hidden_s=0.0, hidden_share=0.0, streamed_check=None)
    handoff = fidelity.prescribed_handoff_s(WHOLE, float(WHOLE.model_spec.kv_bytes(PROMPT)),
                                            float(WHOLE.model_spec.kv_bytes(PROMPT)))
    report = _report(WHOLE, decode, handoff)
    split = report["handoff_split"]
    assert split["exposed_share"] == 1.0 and split["hidden_bytes_share"] == 0.0
    assert report["per_request"][0]["handoff_hidden_s"] is None  # not given: null, never invented
    assert report["link"]["measured_at"] == "middlebox" and report["link"]["busy"] == 0.9
    assert report["fidelity"]["handoff_model"]["ok"]  # the client-side check, as before


def test_a_sweep_row_carries_the_exposed_share_and_its_table_heads_the_layerwise_column_apart(tmp_path):
    rows = []
    for scenario, exposed, hidden in ((WHOLE, 0.09, 0.0), (LAYERWISE, 0.004, 0.05)):
        decode = _decode(scenario, exposed_s=exposed, hidden_s=hidden, hidden_share=0.5, streamed_check=None)
        report = _report(scenario, decode, exposed)
        rows.append(row_from_report(f"k{len(rows)}", scenario, report, wall_s=1.0, report_path=tmp_path / "r.json"))
    assert "exposed_share" in METRIC_COLUMNS and METRIC_COLUMNS.index("exposed_share") > METRIC_COLUMNS.index(
        "placement")  # a new column goes at the end
    assert [r["codec_label"] for r in rows] == ["none", "none layerwise"]
    assert rows[0]["exposed_share"] == 1.0 and math.isclose(rows[1]["exposed_share"], 0.004 / 0.054)
    tables = markdown_tables(rows)
    assert "## eth-25g: exposed share of the hand-off" in tables
    assert "| load (req/s) | none | none layerwise |" in tables
