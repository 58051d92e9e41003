"""Sweeps without live runs: grid expansion, keys, presets, the goodput bisection, the results store's resume
rule, the Markdown tables and the plots (rows made here, run functions that compute instead of running)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvtransit.flows.tier.section import TierSection
from kvtransit.harness.studies.sweep.plan import Grid, bisect_goodput, parse_axis, preset, preset_emulation
from kvtransit.harness.studies.sweep.report import PLOT_FILES, markdown_tables, write_plots
from kvtransit.harness.studies.sweep.runner import (
    METRIC_COLUMNS,
    ResultsStore,
    row_from_report,
    run_sweep,
    search_goodput,
    sweep_points,
)
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_axis_values_are_typed_as_the_scenario_field():
    assert parse_axis("rate=8,10.5") == ("rate", [8.0, 10.5])
    assert parse_axis("max-concurrency=0,4") == ("max_concurrency", [0, 4])
    assert parse_axis("scale=auto,0.1") == ("scale", ["auto", 0.1])


@pytest.mark.parametrize("spec,message", [("rate", "FIELD=V1,V2"), ("speed=1", "unknown scenario field 'speed'"),
                                          ("rate=fast", "rate: expected a number")])
def test_bad_axes_are_named(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_axis(spec)


def test_codec_none_runs_once_whatever_compress_at_says():
    grid = Grid({}, {"codec": ["none", "fp8"], "compress_at": ["transit", "gpu"]})
    assert grid.points() == [{"codec": "none", "compress_at": "transit"}, {"codec": "fp8", "compress_at": "transit"},
                             {"codec": "fp8", "compress_at": "gpu"}]


def test_keys_name_link_codec_place_and_rate_first():
    points = sweep_points([Grid({"requests": 5}, {"rate": [2.0], "seed": [1, 2]})])
    assert [k for k, _ in points] == ["link=eth-25g,codec=freq-keep-k,compress_at=transit,rate=2.0,seed=1",
                                      "link=eth-25g,codec=freq-keep-k,compress_at=transit,rate=2.0,seed=2"]


def test_a_bad_point_fails_before_any_run():
    with pytest.raises(ConfigError, match="rate"):
        sweep_points([Grid({}, {"rate": [2.0, -1.0]})])


def test_handoff_preset_is_the_decks_study():
    points = sweep_points(preset("handoff-25g"))
    assert len(points) == 4 * (1 + 2 * 2)  # loads x (none + fp8/freq-keep-k at transit and at the GPU)
    scenario = points[0][1]
    assert (scenario.model, scenario.device, scenario.gpus, scenario.prefill, scenario.decode) == \
        ("llama3-8b", "h100", 1, 1, 1)
    assert (scenario.requests, scenario.prompt_mean, scenario.output_mean, scenario.seed) == (800, 2048.0, 256.0, 1)
    assert {s.rate for _, s in points} == {8.0, 10.0, 12.0, 14.0} and {s.link for _, s in points} == {"eth-25g"}


def test_links_preset_keeps_every_scaled_link_within_the_host_budget():
    points = sweep_points(preset("links-8rps"))
    assert {s.link for _, s in points} == {"nvlink4", "ib-ndr", "eth-100g", "eth-25g"}
    for _, s in points:
        assert s.scaled_link.bandwidth_Bps <= 40e6 * 1.001 and s.rate == 8.0
    assert preset_emulation("nvlink4")["dilation"] > 2  # one channel of 450 GB/s is too fast at dilation 2


def test_deck_preset_runs_the_shared_point_once():
    assert len(sweep_points(preset("deck"))) == 20 + 12 - 3  # eth-25g x 8 req/s x 3 codecs in transit is shared


def test_tier_deck_preset_is_the_tier_at_the_decks_size_from_a_warmed_pool():
    points = sweep_points(preset("tier-deck"))
    placed = {(s.codec, s.compress_at, s.link) for _, s in points}
    assert placed == {("freq-keep-k", "transit", "eth-100g"), ("freq-keep-k", "gpu", "eth-100g"),
                      ("none", "transit", "eth-100g"), ("none", "transit", "ib-ndr")}
    for _, s in points:
        assert (s.model, s.context_cap, TierSection.of(s).kv_pool, TierSection.of(s).pool_warm, s.trace_start) == \
            ("llama3-70b", 32768, "pool", "trace", 5000)
        assert s.trace == "mooncake-conversation" and s.effective_dilation == 3.0
        # Half the channels the other presets give the link, at least one (the sweep_plan comment says why).
        half = max(1, round(preset_emulation(s.link, "llama3-70b")["scale"] * 1024) // 2)
        assert s.effective_scale == half / 1024


def test_a_trace_points_load_is_its_windows_replayed_rate_not_the_unused_rate_field(tmp_path):
    from kvtransit.harness.studies.sweep.runner import offered_rate

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 1000 * k, "input_length": 600, "output_length": 4,
                                         "hash_ids": [k]}) + "\n" for k in range(5)))
    assert offered_rate(Scenario(trace=str(trace), requests=4, time_scale=2.0, rate=7.0)) == 0.5  # 3 gaps of 2 s
    assert offered_rate(Scenario(rate=7.0)) == 7.0


def _cliff(limit: float):
    """Attainment 1 up to `limit` req/s, then falling off: a stand-in for a live run."""
    return lambda rate: 1.0 if rate <= limit else max(0.0, 1.0 - (rate - limit))


def test_bisection_brackets_the_goodput():
    search = bisect_goodput(_cliff(9.3), 4.0, 16.0, target=0.9, iterations=6)
    assert search.good <= 9.4 < search.bad
    assert search.bad - search.good <= (16 - 4) / 2 ** 6 + 1e-9 or search.bad - search.good <= 0.05 * search.bad
    assert search.evaluations[:2] == [(16.0, 0.0), (4.0, 1.0)]
    assert len(search.evaluations) <= 2 + 6


def test_bisection_stops_after_its_iterations():
    search = bisect_goodput(_cliff(9.3), 4.0, 16.0, iterations=1)
    assert [r for r, _ in search.evaluations] == [16.0, 4.0, 10.0] and search.bracket() == "[4, 10) req/s"


def test_bisection_reports_open_ends():
    assert bisect_goodput(_cliff(100), 1.0, 16.0).bracket() == "[16, none missed it) req/s"
    low = bisect_goodput(_cliff(0.5), 1.0, 16.0)
    assert low.goodput_rps is None and low.bracket() == "[none met the target, 1) req/s"


def test_a_goodput_resting_on_unfaithful_runs_says_so_in_its_answer():
    """The issue's case: a bisection whose runs above ~10 req/s were unfaithful marks the answer and the bracket."""
    search = bisect_goodput(_cliff(14.2), 4.0, 16.0, target=0.9, iterations=4, faithful_at=lambda rate: rate < 10)
    assert not search.faithful and search.unfaithful == [16.0, 10.0, 13.0, 14.5, 13.75]
    assert search.answer() == "13.75 *"
    assert search.bracket() == "[13.75*, 14.5*) req/s; 5 of 6 runs unfaithful"


def test_a_goodput_on_faithful_runs_is_unmarked():
    search = bisect_goodput(_cliff(9.3), 4.0, 16.0, iterations=2, faithful_at=lambda rate: True)
    assert search.faithful and search.answer() == "7" and search.bracket() == "[7, 10) req/s"


def test_a_run_with_no_measure_does_not_meet_the_target():
    assert bisect_goodput(lambda rate: math.nan, 1.0, 2.0).goodput_rps is None


def test_bisection_rejects_a_bad_bracket():
    with pytest.raises(ConfigError, match="low rate < high rate"):
        bisect_goodput(_cliff(1), 5.0, 5.0)


def _row(key: str, scenario: Scenario, **metrics) -> dict:
    from kvtransit.harness.studies.sweep.runner import _parameters

    values = dict(link_busy=0.3, handoff_p99_ms=90.0, ttft_p99_ms=200.0, tpot_p99_ms=10.0, slo_attainment=1.0,
                  goodput_rps=scenario.rate, j_per_token=0.2, wire_bytes=1e9, faithful=True)
    values.update(metrics)
    return {"key": key, "status": "ok", "error": "", "wall_s": 1.0, "report": "", **_parameters(scenario), **values}


class CountingRunner:
    def __init__(self):
        self.keys = []

    def __call__(self, key, scenario):
        self.keys.append(key)
        return _row(key, scenario, slo_attainment=1.0 if scenario.rate <= 9 else 0.5)


def test_a_resumed_sweep_runs_only_what_is_missing(tmp_path):
    points = sweep_points([Grid({"requests": 5}, {"rate": [2.0, 4.0], "codec": ["none", "fp8"]})])
    first = CountingRunner()
    run_sweep(points[:3], ResultsStore(tmp_path), first)
    again = CountingRunner()
    rows = run_sweep(points, ResultsStore(tmp_path), again)
    assert len(first.keys) == 3 and again.keys == [points[3][0]] and len(rows) == 4
    rerun = CountingRunner()
    run_sweep(points, ResultsStore(tmp_path), rerun, rerun=True)
    assert len(rerun.keys) == 4
    assert len(json.loads((tmp_path / "results.json").read_text())["rows"]) == 4
    assert (tmp_path / "results.csv").read_text().count("\n") == 5  # header + 4 rows


def test_a_point_run_with_other_settings_is_run_again(tmp_path):
    key_points = sweep_points([Grid({"requests": 5}, {"rate": [2.0]})])
    run_sweep(key_points, ResultsStore(tmp_path), CountingRunner())
    changed = sweep_points([Grid({"requests": 6}, {"rate": [2.0]})])
    assert changed[0][0] == key_points[0][0]
    runner = CountingRunner()
    run_sweep(changed, ResultsStore(tmp_path), runner)
    assert runner.keys == [changed[0][0]]


def test_a_failed_point_is_tried_again(tmp_path):
    points = sweep_points([Grid({"requests": 5}, {"rate": [2.0]})])
    store = ResultsStore(tmp_path)
    store.add({**_row(points[0][0], points[0][1]), "status": "failed", "error": "boom"})
    runner = CountingRunner()
    run_sweep(points, ResultsStore(tmp_path), runner)
    assert runner.keys == [points[0][0]]


def test_goodput_search_reuses_rates_already_measured(tmp_path):
    base = Scenario(requests=5, codec="none")
    runner = CountingRunner()
    search = search_goodput(base, ResultsStore(tmp_path), runner, lo=4.0, hi=16.0, target=0.9, iterations=3)
    assert search.good <= 9 < search.bad and len(runner.keys) == len(search.evaluations)
    again = CountingRunner()
    search_goodput(base, ResultsStore(tmp_path), again, lo=4.0, hi=16.0, target=0.9, iterations=3)
    assert again.keys == []


def test_a_corrupt_results_file_is_named(tmp_path):
    (tmp_path / "results.json").write_text("[]")
    with pytest.raises(ConfigError, match="not a kvtransit results file"):
        ResultsStore(tmp_path)


def _rows():
    rows = []
    for rate in (8.0, 10.0):
        for codec, at in (("none", "transit"), ("fp8", "gpu"), ("freq-keep-k", "transit")):
            s = Scenario(rate=rate, codec=codec, compress_at=at, requests=5, scale=0.02)
            rows.append(_row(f"{codec}{at}{rate}", s, handoff_p99_ms=100.0 / (1 if codec == "none" else 2) * rate,
                             faithful=rate < 10))
    return rows


def test_tables_are_load_by_codec_per_link_and_metric():
    text = markdown_tables(_rows())
    assert "## eth-25g: SLO attainment" in text and "## eth-25g: hand-off p99 (ms)" in text
    assert "| load (req/s) | none | fp8@gpu | freq-keep-k@transit |" in text
    handoff = text.split("## eth-25g: hand-off p99 (ms)")[1].split("##")[0]
    assert "| 8 | 800.0 | 400.0 | 400.0 |" in handoff
    assert "| 10 | 1000.0 * | 500.0 * | 500.0 * |" in handoff  # not faithful: marked


def test_plots_are_png_images(tmp_path):
    paths = write_plots(_rows(), tmp_path)
    assert [p.name for p in paths] == list(PLOT_FILES)
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 5000


def test_a_row_written_before_a_scenario_field_existed_is_not_run_again(tmp_path):
    points = sweep_points([Grid({"requests": 5}, {"rate": [2.0]})])
    run_sweep(points, ResultsStore(tmp_path), CountingRunner())
    data = json.loads((tmp_path / "results.json").read_text())
    del data["rows"][0]["scenario"]["tpot_slo_ms"]  # as an older kvtransit wrote it: the field at its default
    (tmp_path / "results.json").write_text(json.dumps(data))
    runner = CountingRunner()
    run_sweep(points, ResultsStore(tmp_path), runner)
    assert runner.keys == []


def _report(**extra) -> dict:
    distribution = {"mean": 0.1, "p50": 0.1, "p90": 0.1, "p99": 0.2, "max": 0.2}
    return {"link": {"busy": 0.4, "wire_bytes": 1e9}, "handoff_s": distribution, "ttft_s": distribution,
            "tpot_s": distribution, "slo_attainment": 1.0, "goodput_rps": 2.0, "j_per_token": 0.1,
            "faithful": True, "config": {}, **extra}


def test_a_row_says_which_placement_its_point_ran_on_and_its_kv_wait_share(tmp_path):
    links = {"mode": "netns", "reason": "auto: root with tc", "backends": {"rate": "tc tbf", "delay": "userspace"}}
    report = _report(kv_wait_share=0.25, config={"links": links})
    row = row_from_report("k", Scenario(), report, wall_s=1.0, report_path=tmp_path / "k.json")
    assert (row["placement"], row["kv_wait_share"]) == ("netns (tc tbf)", 0.25)
    # A report from before either existed (no launcher annotation, no share): the columns are empty, not an error.
    old = row_from_report("k", Scenario(), _report(), wall_s=1.0, report_path=tmp_path / "k.json")
    assert old["placement"] is None and old["kv_wait_share"] is None
    assert {"placement", "kv_wait_share"} <= set(METRIC_COLUMNS)


def test_tables_have_the_kv_wait_share_and_the_placement_of_each_point():
    rows = _rows()
    for row in rows:
        row.update(kv_wait_share=0.125, placement="netns (tc tbf)")
    text = markdown_tables(rows)
    share = text.split("## eth-25g: KV wait + transfer share of E2E")[1].split("##")[0]
    assert "| 8 | 12.5% | 12.5% | 12.5% |" in share
    placement = text.split("## eth-25g: placement (--links)")[1].split("##")[0]
    assert "| 8 | netns (tc tbf) | netns (tc tbf) | netns (tc tbf) |" in placement


def test_the_sweep_command_places_points_as_up_does_by_default():
    import argparse

    from kvtransit.cli import sweep, up
    from kvtransit.harness.studies.sweep.runner import PointRunner

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    sweep.register(subparsers)
    up.register(subparsers)
    assert parser.parse_args(["sweep", "--out", "x"]).links == parser.parse_args(["up"]).links == "auto"
    assert PointRunner(Path(".")).links == "auto"
