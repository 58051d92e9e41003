"""The run report's figures: the series they show, the PNGs beside the report and their links in
its Markdown, the report written all the same without matplotlib, and `kvtransit up`'s default report folder."""

from __future__ import annotations

import json
import sys
from datetime import datetime

import pytest

from kvtransit.cli import build_parser
from kvtransit.cli.up import RUNS_DIR, default_report_path
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.report import figures as series
from kvtransit.report.build import build_report, write_report
from kvtransit.report.plots import FIGURE_FILES, PLOTS_MISSING, figures_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(rid: int, arrival: float, ttft: float | None, handoff: float | None, e2e: float | None,
         tpot: float | None = 0.01, outcome: str = "ok", prompt: int = 100) -> dict:
    return {"id": rid, "arrival_s": arrival, "prompt_tokens": prompt, "ttft_s": ttft, "tpot_s": tpot,
            "handoff_s": handoff, "e2e_s": e2e, "outcome": outcome}


# --- the series -------------------------------------------------------------------------------------------------

def test_a_cdf_is_sorted_and_climbs_to_one_in_steps_of_one_over_n():
    c = series.cdf([0.3, 0.1, 0.2, 0.2])
    assert c.xs == (0.1, 0.2, 0.2, 0.3) and c.ys == (0.25, 0.5, 0.75, 1.0)
    assert series.cdf([]) == series.Cdf((), ())


def test_the_slo_lines_are_the_runs_own_thresholds_and_reference_4s_by_default():
    rows = [_row(i, i * 0.1, 0.2 + i * 0.01, 0.05, 1.0) for i in range(10)]
    default = {c.name: c for c in series.latency_cdfs({"config": {}, "per_request": rows})}
    assert default["ttft_cdf"].line_s == 1.0 and default["tpot_cdf"].line_s == 0.025  # docs/reference.md §4
    assert default["handoff_cdf"].line_s is None  # no SLO on the hand-off
    own = {c.name: c for c in series.latency_cdfs({"config": {"ttft_slo_ms": 500.0, "tpot_slo_ms": 40.0},
                                                   "per_request": rows})}
    assert own["ttft_cdf"].line_s == 0.5 and own["tpot_cdf"].line_s == 0.04
    assert own["ttft_cdf"].line_label == "TTFT SLO 500 ms"


def test_ttft_and_tpot_cdfs_count_the_steady_window_and_the_handoff_counts_every_request():
    rows = [_row(i, float(i), 0.1 * (i + 1), 0.01 * (i + 1), 2.0) for i in range(10)]
    rows.append(_row(10, 10.0, 0.5, None, None, tpot=None, outcome="failed"))  # no hand-off, never finished
    cdfs = {c.name: c for c in series.latency_cdfs({"config": {}, "per_request": rows})}
    # 11 requests: the first ⌊1.1⌋ = 1 by arrival is warm-up; the failed one is not finished.
    assert cdfs["ttft_cdf"].measured.xs == pytest.approx([0.1 * (i + 1) for i in range(1, 10)])
    assert len(cdfs["tpot_cdf"].measured.xs) == 9
    assert cdfs["handoff_cdf"].measured.xs == pytest.approx([0.01 * (i + 1) for i in range(10)])


def test_open_handoffs_on_the_link_and_queued_match_a_hand_computed_example():
    # Hand-offs open (first token → KV ready): [0, 2), [1, 3), [1.5, 4), [3, 5) on one lane.
    occ = series.link_occupancy([(0.0, 2.0), (1.0, 3.0), (1.5, 4.0), (3.0, 5.0)], lanes=1, end_s=10.0, bins=10)
    assert occ.times_s == (0.0, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0)
    assert occ.open == (1, 2, 3, 2, 2, 1, 0)  # at 3.0 one ends as another starts: still 2
    assert occ.on_link == (1, 1, 1, 1, 1, 1, 0)
    assert occ.queued == (0, 1, 2, 1, 1, 0, 0)
    assert occ.busy == pytest.approx([1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
    two_lanes = series.link_occupancy([(0.0, 2.0), (1.0, 3.0), (1.5, 4.0)], lanes=2, end_s=4.0, bins=4)
    assert two_lanes.queued == (0, 0, 1, 0, 0, 0)
    # Bin [1, 2): two lanes sending all of it; bin [3, 4): one of two.
    assert two_lanes.busy == pytest.approx([0.5, 1.0, 1.0, 0.5])


def test_the_occupancy_comes_from_first_token_plus_handoff_and_a_bad_lane_count_is_refused():
    rows = [_row(0, 0.0, 0.5, 0.25, 1.0), _row(1, 0.2, 0.4, 0.5, 1.5), _row(2, 0.3, None, None, None, tpot=None,
                                                                          outcome="timed-out")]
    spans = series.handoff_intervals(rows)  # (first token, first token + hand-off); none for the timed-out one
    assert [x for span in spans for x in span] == pytest.approx([0.5, 0.75, 0.6, 1.1])
    occ = series.occupancy_of({"config": {"channels": 1}, "run": {"model_s": 2.0}, "per_request": rows})
    assert occ.queued == (0, 0, 1, 0, 0) and occ.end_s == 2.0
    with pytest.raises(ConfigError, match="link lanes must be >= 1, got 0"):
        series.link_occupancy([], lanes=0)


def test_the_timeline_takes_the_first_requests_by_id_with_their_four_instants():
    rows = [_row(i, float(i), 0.5, 0.25, 2.0) for i in reversed(range(30))]
    rows[0] = _row(29, 29.0, 0.5, None, None, tpot=None, outcome="failed")
    timeline = series.timeline(rows)
    assert [r.request_id for r in timeline] == list(range(series.TIMELINE_SAMPLE))
    first = timeline[0]
    assert (first.arrival_s, first.first_token_s, first.kv_ready_s, first.finish_s) == (0.0, 0.5, 0.75, 2.0)
    assert series.timeline(rows, sample=30)[-1] == series.TimelineRow(29, 29.0, 29.5, None, None, "failed")


def test_every_caption_says_the_scale_and_dilation_it_was_measured_at():
    config = Scenario(dilation=2.0).describe()
    captions = series.captions({"config": config, "per_request": []})
    assert set(captions) == set(FIGURE_FILES)
    for caption in captions.values():
        assert f"scale {config['effective_scale']:.4g}, dilation 2" in caption
    assert "derived from the per-request records" in captions["link_occupancy"]


# --- drawn beside the report ------------------------------------------------------------------------------------

def _record(rid: int, arrival: float) -> RequestRecord:
    first = arrival + 0.05
    return RequestRecord(request_id=rid, arrival_s=arrival, prompt_tokens=512, output_tokens=3,
                         token_times_s=[first, first + 0.02, first + 0.03], kv_ready_s=first + 0.01,
                         decode_wait_s=0.0)


def _report() -> dict:
    decode = {"role": "decode", "name": "decode-0", "link": {"wire_bytes": 4e6, "raw_bytes": 8e6, "busy_s": 0.2},
              "accuracy": {"sampled_requests": 0, "k_relative_error": None, "v_relative_error": None}}
    return build_report(Scenario(codec="none"), [_record(i, i * 0.1) for i in range(25)], [decode], run_wall_s=3.0,
                        tokens_delivered=75)


def test_the_report_draws_five_pngs_beside_it_and_its_markdown_links_them(tmp_path):
    json_path, md_path = write_report(_report(), tmp_path / "report.json")
    figures = json.loads(json_path.read_text())["figures"]
    # Five: the sixth, where the run parted from its twin, needs the twin block the harness joins in (below).
    assert [f["name"] for f in figures] == [name for name in FIGURE_FILES if name != "twin_departure"]
    markdown = md_path.read_text()
    for figure in figures:
        png = tmp_path / figure["file"]
        assert png.parent == figures_dir(json_path) and png.read_bytes()[:8] == PNG_MAGIC
        assert f"]({figure['file']})" in markdown and figure["caption"] in markdown
        assert "scale " in figure["caption"] and "dilation 1" in figure["caption"]
    # Whole mode: the hand-off's model line is each request's prescribed idle-link figure.
    assert "prescribed hand-off" in {f["name"]: f for f in figures}["handoff_cdf"]["caption"]
    assert PLOTS_MISSING not in markdown


def test_a_link_with_a_space_in_the_report_name_is_url_quoted(tmp_path):
    _, md_path = write_report(_report(), tmp_path / "my run.json")
    assert "](my%20run.figures/ttft_cdf.png)" in md_path.read_text()
    assert (tmp_path / "my run.figures" / "ttft_cdf.png").exists()


def test_without_matplotlib_the_report_still_writes_and_says_the_plots_extra_is_missing(tmp_path, monkeypatch):
    # A module set to None in sys.modules makes its import raise ImportError: matplotlib as if not installed.
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)
    json_path, md_path = write_report(_report(), tmp_path / "report.json")
    assert json.loads(json_path.read_text())["figures"] == []
    markdown = md_path.read_text()
    assert [line for line in markdown.splitlines() if "plots extra" in line] == [PLOTS_MISSING]
    assert "![" not in markdown and not figures_dir(json_path).exists()


# --- where `kvtransit up` puts its report -----------------------------------------------------------------------

def test_kvtransit_up_writes_under_runs_by_default_and_keeps_an_explicit_report(tmp_path):
    assert build_parser().parse_args(["up"]).report is None  # resolved when the run starts
    assert build_parser().parse_args(["up", "--report", "x/r.json"]).report.as_posix() == "x/r.json"
    at = datetime(2025, 3, 4, 5, 6, 7)
    first = default_report_path(at, runs=tmp_path / RUNS_DIR)
    assert first == tmp_path / "runs" / "20250304-050607" / "report.json"
    assert first.with_suffix(".run") == tmp_path / "runs" / "20250304-050607" / "report.run"  # the launcher's
    first.parent.mkdir(parents=True)  # that second's folder is taken: the next run gets its own
    assert default_report_path(at, runs=tmp_path / RUNS_DIR) == tmp_path / "runs" / "20250304-050607-2" / "report.json"
    assert default_report_path().parts[0] == "runs"


def test_a_run_beside_its_twin_overlays_the_twins_cdfs_and_draws_where_they_part(tmp_path):
    from kvtransit.model.scenario import Scenario
    from kvtransit.twin.diff import attach_twin
    from kvtransit.twin.report import twin_report
    from kvtransit.twin.serving import run_twin

    scenario = Scenario.build(requests=40, rate=4.0)
    live = twin_report(run_twin(scenario), wall_s=None)
    for row in live["per_request"]:  # as if every request had waited 2 ms more for decode to admit it
        row["decode_wait_s"] += 0.002
        row["e2e_s"] += 0.002
    live.update(source="live")
    attach_twin(live, scenario)
    json_path, _ = write_report(live, tmp_path / "report.json")
    figures = {f["name"]: f for f in json.loads(json_path.read_text())["figures"]}
    assert list(figures) == list(FIGURE_FILES)
    assert (tmp_path / figures["twin_departure"]["file"]).read_bytes()[:8] == PNG_MAGIC
    assert "dotted: the same requests on the twin" in figures["ttft_cdf"]["caption"]
    departures = series.departures(live["per_request"])
    assert len(departures) == 40
    assert all(d.stage_delta_s["decode admission"] == pytest.approx(0.002) for d in departures)
