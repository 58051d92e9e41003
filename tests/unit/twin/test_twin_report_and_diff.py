"""The twin's report has the live report's shape (twin/report.py), and a live run is set beside its twin request by
request (twin/diff.py)."""

from __future__ import annotations

import copy
import json

import pytest

from kvtransit.cli import main
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import build_report
from kvtransit.report.text import to_markdown
from kvtransit.twin.diff import STAGES, attach_twin, diff_runs
from kvtransit.twin.report import twin_report
from kvtransit.twin.serving import run_twin

SCENARIO = dict(requests=60, rate=4.0)


def _twin_report(**values):
    return twin_report(run_twin(Scenario.build(**{**SCENARIO, **values})), wall_s=0.5)


def test_the_twin_report_has_every_key_a_live_report_has_and_says_it_is_the_twins():
    scenario = Scenario.build(**SCENARIO)
    twin = run_twin(scenario)
    live_shape = build_report(scenario, twin.records, [], run_wall_s=twin.run_s, tokens_delivered=1)
    report = twin_report(twin, wall_s=0.5)
    assert set(live_shape) <= set(report)
    assert set(live_shape["per_request"][0]) == set(report["per_request"][0])
    assert report["source"] == "twin" and report["link"]["measured_at"] == "twin"
    assert report["faithful"] is False and not report["fidelity"]["twin"]["ok"]
    json.dumps(report, allow_nan=False)


def test_the_twin_reports_text_says_every_figure_is_the_models():
    text = to_markdown(_twin_report())
    assert text.startswith("# kvtransit twin report")
    assert "TWIN: the model on a virtual clock" in text and "none measured" in text
    assert "scale 0.0" not in text  # the twin has no scale


def _shifted(report, request_id, **deltas):
    """A copy of `report` as if request `request_id` had taken longer in the given stages."""
    live = copy.deepcopy(report)
    row = next(r for r in live["per_request"] if r["id"] == request_id)
    for key, delta in deltas.items():
        row[key] += delta
        row["e2e_s"] += delta  # every stage lies inside E2E
    return live


def test_a_request_that_waited_longer_on_the_link_is_the_first_parting_and_the_link_holds_the_difference():
    twin = _twin_report()
    live = _shifted(twin, 17, handoff_s=0.250)
    diff = diff_runs(live, twin)
    assert diff["compared"] == 60
    top = diff["partings"][0]
    assert top["id"] == 17 and top["stage"] == "link" and top["link_delta_s"] == pytest.approx(0.250)
    assert top["e2e_delta_s"] == pytest.approx(0.250)
    assert diff["stage_share"]["link"] == pytest.approx(1.0)
    assert set(diff["stage_share"]) == set(STAGES)


def test_identical_runs_differ_by_nothing_and_ended_the_same():
    twin = _twin_report()
    diff = diff_runs(copy.deepcopy(twin), twin)
    assert all(d["max"] == 0 and d["min"] == 0 for d in diff["delta_s"].values() if d["count"])
    assert diff["outcomes_differ"] == []
    assert all(share is None for share in diff["stage_share"].values())


def test_a_request_that_ended_differently_is_listed():
    twin = _twin_report()
    live = copy.deepcopy(twin)
    live["per_request"][5].update(outcome="failed", failure="middlebox gone")
    assert diff_runs(live, twin)["outcomes_differ"] == [
        {"id": 5, "live": "failed", "twin": "ok", "live_failure": "middlebox gone"}]


def test_attach_twin_puts_the_twins_figures_in_every_row_and_refuses_an_unmodelled_flow_by_name():
    scenario = Scenario.build(**SCENARIO)
    live = _twin_report()
    attach_twin(live, scenario)
    assert all(row["twin"]["ttft_s"] is not None for row in live["per_request"])
    assert live["twin"]["compared"] == 60
    refused = attach_twin({"per_request": []}, Scenario.build(**SCENARIO, kv_pool="pool"))
    assert refused["twin"]["refused"].startswith("tier: ")


def test_the_twin_command_prints_the_table_and_writes_the_report(tmp_path, capsys):
    path = tmp_path / "twin.json"
    assert main(["twin", "--requests", "40", "--rate", "3", "--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "kvtransit twin" in out and "TWIN: the model on a virtual clock" in out
    written = json.loads(path.read_text())
    assert written["source"] == "twin" and written["requests"]["total"] == 40
    assert path.with_suffix(".md").exists()


def test_the_twin_command_refuses_a_flow_it_cannot_model_in_one_line(capsys):
    assert main(["twin", "--kv-pool", "pool"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvtransit twin: error: twin: no model yet for flow tier: ") and "\n" not in err


def test_a_live_run_whose_requests_all_failed_still_gets_a_finite_twin_block():
    """Nothing to compare (every live request failed): the diff's figures are null, and the report stays JSON."""
    live = _twin_report()
    for row in live["per_request"]:
        row.update(outcome="failed", failure="decode gone", ttft_s=None, tpot_s=None, e2e_s=None, handoff_s=None,
                   decode_wait_s=None)
    attach_twin(live, Scenario.build(**SCENARIO))
    json.dumps(live, allow_nan=False)
    assert live["twin"]["compared"] == 0 and len(live["twin"]["outcomes_differ"]) == 60
