"""Baselines at equal power: the next faster link, the three scenarios, the comparison of three reports
(energy per request, latency, fail-closed on unfaithful runs), the `baselines` sweep preset with the user's flags,
`kvtransit verdict --baselines` and the sweep tables' J/request."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kvtransit.cli import build_parser, main
from kvtransit.cli.sweep import _grids
from kvtransit.harness.studies.sweep.baselines import (
    AT_GPU,
    BASELINES,
    FASTER_LINK,
    HANDOFF_LINKS,
    IN_TRANSIT,
    baseline_scenarios,
    compare_at_equal_power,
    energy_per_request,
    identify_baselines,
    next_faster_link,
)
from kvtransit.harness.studies.sweep.plan import preset, preset_emulation
from kvtransit.harness.studies.sweep.report import markdown_tables
from kvtransit.harness.studies.sweep.runner import _parameters, sweep_points
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import build_report, write_report

KERNEL = Scenario(codec="freq-keep-k", compress_at="transit", link="eth-25g", scale=0.0625)


# --- the next faster link ----------------------------------------------------------------------------------

def test_the_next_faster_link_is_the_next_link_a_hand_off_can_cross():
    assert next_faster_link("eth-25g") == "eth-100g"
    assert next_faster_link("eth-100g") == "ib-ndr"  # not pcie4: PCIe carries KV inside a host (the KV tier)
    assert next_faster_link("ib-ndr") == "nvlink4"
    assert next_faster_link("nvlink4") is None
    for name in HANDOFF_LINKS:
        faster = next_faster_link(name)
        if faster is None:
            continue
        bandwidth = LINKS[faster].bandwidth_Bps
        assert bandwidth > LINKS[name].bandwidth_Bps
        assert not [o for o in HANDOFF_LINKS if LINKS[name].bandwidth_Bps < LINKS[o].bandwidth_Bps < bandwidth]


def test_the_fastest_link_has_none_faster_and_the_modules_line_rate_is_never_the_answer():
    assert next_faster_link("nvlink4") is None
    assert "qsfp56" not in {next_faster_link(name) for name in LINKS}  # unpriced: it would win energy for free
    with pytest.raises(ConfigError, match="link"):
        next_faster_link("token-ring")


# --- the three scenarios -----------------------------------------------------------------------------------

def test_the_three_scenarios_differ_only_where_the_baseline_says():
    three = baseline_scenarios(KERNEL)
    assert list(three) == list(BASELINES)
    assert three[IN_TRANSIT] == KERNEL
    assert three[AT_GPU].compress_at == "gpu" and three[AT_GPU].codec == "freq-keep-k"
    assert three[AT_GPU].link == "eth-25g" and three[AT_GPU].scale == KERNEL.scale
    faster = three[FASTER_LINK]
    assert (faster.codec, faster.link) == ("none", "eth-100g")
    # Emulated by the preset's rule for its own link: a smaller scale for four times the bandwidth.
    assert faster.effective_scale == pytest.approx(preset_emulation("eth-100g")["scale"])
    assert faster.effective_scale < KERNEL.effective_scale
    assert {k: v for k, v in faster.as_dict().items() if k not in ("codec", "link", "scale", "dilation")} == \
        {k: v for k, v in KERNEL.as_dict().items() if k not in ("codec", "link", "scale", "dilation")}


def test_an_auto_scale_stays_auto_and_is_worked_out_for_each_link():
    three = baseline_scenarios(Scenario(codec="fp8", scale="auto"))
    assert three[FASTER_LINK].scale == "auto" and three[FASTER_LINK].link == "eth-100g"


def test_codec_none_or_the_fastest_link_has_no_baseline_to_compare():
    with pytest.raises(ConfigError, match="codec 'none' has no kernel to compare"):
        baseline_scenarios(Scenario(codec="none"))
    with pytest.raises(ConfigError, match="'nvlink4' is the fastest"):
        baseline_scenarios(Scenario(codec="fp8", link="nvlink4"))


# --- three made-up reports -----------------------------------------------------------------------------------

def _records(gap_s: float, n: int = 10) -> list[RequestRecord]:
    # Arrival at k s, first token 60 ms later, 5 tokens `gap_s` apart, KV ready 80 ms after the first token.
    return [RequestRecord(k, float(k), 2048, 5, [k + 0.06 + i * gap_s for i in range(5)], k + 0.14,
                          decode_wait_s=0.01) for k in range(n)]


def _report(scenario: Scenario, *, gpu_j: float, module_j: float = 0.0, gap_s: float = 0.1,
            faithful: bool = True) -> dict:
    decode = {"role": "decode", "name": "decode-0", "gpu_energy_j": gpu_j,
              "link": {"wire_bytes": 8e6, "raw_bytes": 16e6, "busy_s": 0.8, "transfers": 10},
              "accuracy": {"sampled_requests": 0, "k_relative_error": None, "v_relative_error": None}}
    middlebox = {"role": "middlebox", "name": "middlebox", "module_energy_j": module_j, "frames_in": 320,
                 "frames_out": 320, "transit_bound_frames": 0}
    report = build_report(scenario, _records(gap_s), [decode, middlebox], run_wall_s=10.0, tokens_delivered=50)
    report = json.loads(json.dumps(report))
    report["faithful"] = faithful  # made up: the fidelity checks need live agents
    return report


def _three(*, transit_faithful: bool = True, faster_gap_s: float = 0.1) -> dict[str, dict]:
    three = baseline_scenarios(KERNEL)
    return {IN_TRANSIT: _report(three[IN_TRANSIT], gpu_j=10.0, module_j=1.0, gap_s=0.08, faithful=transit_faithful),
            AT_GPU: _report(three[AT_GPU], gpu_j=14.0, gap_s=0.09),
            FASTER_LINK: _report(three[FASTER_LINK], gpu_j=12.0, gap_s=faster_gap_s)}


def test_energy_per_request_is_every_joule_over_the_requests_that_finished():
    report = _three()[IN_TRANSIT]
    report["requests"].update(ok=6, slo_miss=2, failed=2)
    value, counted = energy_per_request(report)
    parts = [v for v in report["energy_j"].values() if v is not None]
    assert counted == 8 and value == pytest.approx(sum(parts) / 8)
    report["requests"].update(ok=0, slo_miss=0)
    assert energy_per_request(report) == (None, 0)  # nothing finished: no figure, not a division by zero


def test_the_kernel_that_wins_energy_and_latency_beats_both():
    comparison = compare_at_equal_power(_three())
    assert comparison["energy_winner"] == IN_TRANSIT and comparison["latency_winner"] == IN_TRANSIT
    assert comparison["kernel_beats_both"] is True and comparison["answer"].startswith("yes:")
    rows = {row["baseline"]: row for row in comparison["baselines"]}
    assert rows[FASTER_LINK]["link"] == "eth-100g" and rows[FASTER_LINK]["codec"] == "none"
    assert rows[AT_GPU]["codec"] == "freq-keep-k@gpu"
    assert rows[FASTER_LINK]["scale"] == pytest.approx(preset_emulation("eth-100g")["scale"])
    assert rows[IN_TRANSIT]["scale"] == pytest.approx(KERNEL.effective_scale)
    assert rows[IN_TRANSIT]["j_per_request"] < rows[FASTER_LINK]["j_per_request"] < rows[AT_GPU]["j_per_request"]


def test_a_faster_link_with_lower_latency_means_the_kernel_does_not_beat_both():
    comparison = compare_at_equal_power(_three(faster_gap_s=0.05))
    assert comparison["latency_winner"] == FASTER_LINK and comparison["energy_winner"] == IN_TRANSIT
    assert comparison["kernel_beats_both"] is False and comparison["answer"].startswith("no:")


def test_a_comparison_resting_on_an_unfaithful_run_is_not_settled_and_says_so():
    comparison = compare_at_equal_power(_three(transit_faithful=False))
    assert comparison["kernel_beats_both"] is None
    assert comparison["unsettled"] == [f"{IN_TRANSIT} was not faithful"]
    assert comparison["answer"].startswith("not settled (kernel in transit was not faithful)")
    assert "energy: kernel in transit (an unfaithful run)" in comparison["answer"]


def test_reports_are_recognised_by_their_config_not_their_order_and_a_missing_one_is_named():
    three = _three()
    shuffled = list(three.items())
    random.Random(3).shuffle(shuffled)
    named = identify_baselines({f"r{i}.json": report for i, (_, report) in enumerate(shuffled)})
    assert all(named[name] is three[name] for name in BASELINES)
    with pytest.raises(ConfigError, match="no report for 'kernel at the GPU'"):
        identify_baselines({"a": three[IN_TRANSIT], "b": three[FASTER_LINK]})
    with pytest.raises(ConfigError, match="a and b are both 'kernel in transit'"):
        identify_baselines({"a": three[IN_TRANSIT], "b": three[IN_TRANSIT], "c": three[FASTER_LINK]})
    other = _report(Scenario(codec="none", link="ib-ndr", scale=0.0625), gpu_j=1.0)
    with pytest.raises(ConfigError, match="not the link next faster than 'eth-25g' \\('eth-100g'\\)"):
        identify_baselines({"a": three[IN_TRANSIT], "b": three[AT_GPU], "c": other})


# --- the preset ----------------------------------------------------------------------------------------------

def _preset_points(*flags: str) -> list[tuple[str, Scenario]]:
    args = build_parser().parse_args(["sweep", "--out", "unused", "--preset", "baselines", *flags])
    return sweep_points(_grids(args))


def test_the_baselines_preset_is_the_three_for_the_decks_workload_at_8_rps():
    points = sweep_points(preset("baselines"))
    assert [key for key, _ in points] == ["link=eth-25g,codec=freq-keep-k,compress_at=transit,rate=8.0",
                                          "link=eth-25g,codec=freq-keep-k,compress_at=gpu,rate=8.0",
                                          "link=eth-100g,codec=none,compress_at=transit,rate=8.0"]
    assert {s.requests for _, s in points} == {800} and {s.prompt_mean for _, s in points} == {2048.0}
    for _, scenario in points:
        assert scenario.effective_scale == pytest.approx(preset_emulation(scenario.link)["scale"])
        assert scenario.effective_dilation == preset_emulation(scenario.link)["dilation"]


def test_the_users_link_and_codec_move_all_three_points():
    points = _preset_points("--link", "eth-100g", "--codec", "fp8", "--rate", "6", "--requests", "20")
    assert [key for key, _ in points] == ["link=eth-100g,codec=fp8,compress_at=transit,rate=6.0",
                                          "link=eth-100g,codec=fp8,compress_at=gpu,rate=6.0",
                                          "link=ib-ndr,codec=none,compress_at=transit,rate=6.0"]
    assert {s.requests for _, s in points} == {20}
    assert points[2][1].effective_scale == pytest.approx(preset_emulation("ib-ndr")["scale"])
    # The three are exactly what baseline_scenarios makes of the first.
    assert [s for _, s in points] == list(baseline_scenarios(points[0][1]).values())


def test_the_preset_refuses_codec_none_and_the_fastest_link_before_anything_runs():
    with pytest.raises(ConfigError, match="codec 'none' has no kernel to compare"):
        _preset_points("--codec", "none")
    with pytest.raises(ConfigError, match="'nvlink4' is the fastest"):
        _preset_points("--link", "nvlink4")


# --- the CLI and the sweep tables ------------------------------------------------------------------------------

def _write_three(tmp_path, **kwargs) -> dict[str, str]:
    return {name: str(write_report(report, tmp_path / f"r{i}.json", figures=False)[0])
            for i, (name, report) in enumerate(_three(**kwargs).items())}


def test_cli_prints_the_three_side_by_side_in_any_order_with_the_answer(tmp_path, capsys):
    files = _write_three(tmp_path)
    assert main(["verdict", "--baselines", files[FASTER_LINK], files[IN_TRANSIT], files[AT_GPU]]) == 0
    out = capsys.readouterr().out
    for text in ("J/request", "E2E mean/p99 ms", "hand-off p99 ms", "scale/dilation", "freq-keep-k@gpu",
                 "eth-100g", "is the kernel worth its module at equal power? yes:"):
        assert text in out
    assert main(["verdict", "--baselines", "--json", *files.values()]) == 0
    comparison = json.loads(capsys.readouterr().out)
    assert [row["report"] for row in comparison["baselines"]] == [files[name] for name in BASELINES]


def test_cli_names_the_missing_baseline_and_says_when_a_run_was_unfaithful(tmp_path, capsys):
    files = _write_three(tmp_path, transit_faithful=False)
    assert main(["verdict", "--baselines", files[IN_TRANSIT], files[AT_GPU], files[AT_GPU]]) == 2
    assert "no report for 'next faster link'" in capsys.readouterr().err
    assert main(["verdict", "--baselines", files[IN_TRANSIT], files[AT_GPU]]) == 2
    assert "takes three reports" in capsys.readouterr().err
    assert main(["verdict", "--baselines", *files.values()]) == 0
    assert "not settled (kernel in transit was not faithful)" in capsys.readouterr().out


def test_sweep_tables_carry_j_per_request_from_each_points_report(tmp_path):
    files = _write_three(tmp_path)
    three = baseline_scenarios(KERNEL)
    rows = [{"key": name, "status": "ok", "error": "", "wall_s": 1.0, "report": files[name],
             **_parameters(three[name]), "faithful": True} for name in BASELINES]
    rows.append({**rows[1], "key": "moved", "report": str(tmp_path / "gone.json"), "rate": 4.0})
    j = {name: energy_per_request(json.loads(Path(files[name]).read_text()))[0] for name in BASELINES}
    text = markdown_tables(rows)
    table = text.split("## eth-25g: J/request")[1].split("##")[0]
    assert "| load (req/s) | freq-keep-k@gpu | freq-keep-k@transit |" in table
    assert f"| 2 | {j[AT_GPU]:.3f} | {j[IN_TRANSIT]:.3f} |" in table
    assert "| 4 | - |  |" in table  # its report is gone: no figure, the table still draws
    assert f"{j[FASTER_LINK]:.3f}" in text.split("## eth-100g: J/request")[1].split("##")[0]


def test_runs_within_the_emulators_resolution_are_a_tie_not_a_win():
    three = baseline_scenarios(KERNEL)  # all three within 1 % of one another on both figures
    comparison = compare_at_equal_power({
        IN_TRANSIT: _report(three[IN_TRANSIT], gpu_j=10.0, module_j=0.05, gap_s=0.080),
        AT_GPU: _report(three[AT_GPU], gpu_j=10.05, gap_s=0.0802),
        FASTER_LINK: _report(three[FASTER_LINK], gpu_j=10.02, gap_s=0.0801)})
    assert comparison["energy_winner"].startswith("tie: ") and comparison["latency_winner"].startswith("tie: ")
    assert IN_TRANSIT in comparison["energy_winner"] and comparison["kernel_beats_both"] is False
    assert comparison["answer"].startswith("no measurable difference: all within 5%"), comparison["answer"]
