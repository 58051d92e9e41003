"""Sweeps over live runs: `kvtransit sweep` and `kvtransit plot` end to end, a live goodput bisection, and a
replay of the real Mooncake conversation trace. Every point is the real testbed on loopback; runs are short
(a dozen requests, outputs of ~16 tokens) so the file stays well under two minutes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kvtransit.cli import main
from kvtransit.harness.studies.sweep.runner import PointRunner, ResultsStore, search_goodput
from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.scenario import Scenario

# Rows written, tables, plots, resumption, a bisection between SLOs nothing or everything meets, a trace's requests:
# what the sweep did, not how fast the host did it, so these may run beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(180), pytest.mark.shares_host]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Short and light; a small scale and dilation 2 keep every run faithful on a busy 2-core box.
SHORT = ["--requests", "8", "--prompt-mean", "1024", "--output-mean", "16", "--scale", "0.02", "--dilation", "2",
         "--accuracy-sample", "0", "--no-progress", "--drain-timeout", "10"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    code = main(["sweep", "--out", str(out), "--grid", "rate=2,6", "--grid", "codec=none,freq-keep-k", *SHORT])
    return out, code


def test_sweep_writes_one_row_per_point_with_metrics_and_parameters(swept):
    out, code = swept
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert sorted((r["rate"], r["codec"]) for r in rows) == [(2.0, "freq-keep-k"), (2.0, "none"),
                                                             (6.0, "freq-keep-k"), (6.0, "none")]
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert 0 <= row["slo_attainment"] <= 1 and row["ttft_p99_ms"] > 0 and row["tpot_p99_ms"] > 0
        assert row["handoff_p99_ms"] > 0 and 0 < row["link_busy"] < 1 and row["wire_bytes"] > 0
        assert row["j_per_token"] > 0 and isinstance(row["faithful"], bool)
        assert Path(row["report"]).exists()
    by_codec = {(r["rate"], r["codec"]): r for r in rows}
    # freq-keep-k keeps half: half the bytes on the wire (the same requests either way)
    assert by_codec[(2.0, "freq-keep-k")]["wire_bytes"] == pytest.approx(by_codec[(2.0, "none")]["wire_bytes"] / 2,
                                                                           rel=0.01)
    assert (out / "results.csv").read_text().count("\n") == 5


def test_sweep_writes_the_markdown_tables_and_png_plots(swept):
    out, _ = swept
    text = (out / "results.md").read_text()
    assert "## eth-25g: TPOT p99 (ms)" in text and "| load (req/s) | none | freq-keep-k@transit |" in text
    for name in ("slo_attainment.png", "handoff_p99.png", "link_busy.png", "tpot_p99.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 5000, name


def test_a_second_sweep_reruns_nothing(swept, capsys):
    out, _ = swept
    before = {p.name: p.stat().st_mtime_ns for p in (out / "points").glob("*.json")}
    capsys.readouterr()
    assert main(["sweep", "--out", str(out), "--grid", "rate=2,6", "--grid", "codec=none,freq-keep-k", *SHORT]) == 0
    assert "points run now: 0; already in the results file: 4" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in (out / "points").glob("*.json")} == before


def test_plot_command_redraws_from_the_results_file(swept, tmp_path):
    out, _ = swept
    assert main(["plot", str(out / "results.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "handoff_p99.png").read_bytes()[:8] == PNG_SIGNATURE


def test_live_goodput_bisection_brackets_the_rate_where_a_tight_tpot_slo_breaks(tmp_path):
    # TPOT SLO of 1 ms: nothing meets it, at any load; 500 ms: everything does. Each end is one live run.
    base = Scenario(requests=6, prompt_mean=1024.0, output_mean=16.0, scale=0.02, dilation=2.0, codec="none")
    runner = PointRunner(tmp_path, accuracy_sample=0, drain_timeout_s=10.0)
    tight = search_goodput(Scenario.build(**{**base.as_dict(), "tpot_slo_ms": 1.0}), ResultsStore(tmp_path / "tight"),
                           runner, lo=1.0, hi=4.0, target=0.9, iterations=1)
    assert tight.goodput_rps is None and [r for r, _ in tight.evaluations] == [4.0, 1.0]
    loose = search_goodput(Scenario.build(**{**base.as_dict(), "tpot_slo_ms": 500.0}), ResultsStore(tmp_path / "loose"),
                           runner, lo=1.0, hi=4.0, target=0.9, iterations=1)
    assert loose.goodput_rps == 4.0 and len(loose.evaluations) == 1


def test_the_real_mooncake_trace_replays_with_time_scaling_and_a_context_cap(tmp_path):
    # The trace's first 12 requests (ten at t=0, two at 3 s, one with an 87k-token prompt), 10x faster, prompts
    # capped at 4,096 tokens; outputs as the trace has them (up to 794 tokens).
    scenario = Scenario(trace="mooncake-conversation", requests=12, time_scale=0.1, context_cap=4096, codec="none",
                        scale=0.01, dilation=1.0)
    launcher = Launcher(scenario, report_path=tmp_path / "trace.json", accuracy_sample=0, drain_timeout_s=60.0,
                        figures=False, log=lambda _line: None, links="loopback")
    report = json.loads(asyncio.run(launcher.run()).read_text())
    workload = report["workload"]
    assert workload["source"] == "trace" and workload["trace_requests"] == 12031
    assert workload["sampling"] == "first 12 of 12031" and workload["time_scale"] == 0.1
    assert workload["prompts_capped"] >= 1 and workload["replay_span_s"] == pytest.approx(0.3)
    per_request = report["per_request"]
    assert max(r["prompt_tokens"] for r in per_request) == 4096
    assert [r["output_tokens"] for r in per_request][:4] == [500, 490, 794, 316]
    assert report["requests"]["ok"] + report["requests"]["slo_miss"] == 12, report["requests"]
    assert per_request[-1]["arrival_s"] == pytest.approx(0.3, abs=0.05)  # 3 s of trace time at 0.1


def _processes_naming(text: str) -> list[int]:
    """Pids of processes whose command line mentions `text` (this test's own directory: nobody else's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
    return found


def test_a_signal_stops_the_sweep_with_every_process_gone_and_nothing_half_recorded(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "interrupted"
    argv = [sys.executable, "-m", "kvtransit.cli", "sweep", "--out", str(out), "--grid", "rate=1,2", "--links",
            "loopback", "--no-plots", *SHORT]
    argv[argv.index("8")] = "40"  # a first point long enough to be interrupted in
    sweep = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(_processes_naming(str(out))) < 2:  # the sweep and its first point's load generator (--report)
            assert sweep.poll() is None and time.monotonic() < deadline, "the first point never started"
            time.sleep(0.2)
        time.sleep(2.0)
        sweep.send_signal(signal.SIGTERM)
        _, err = sweep.communicate(timeout=90)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode == 130
    assert "interrupted during point" in err and "the same command resumes" in err
    assert _processes_naming(str(out)) == []  # the point's agents were stopped with it
    rows = json.loads((out / "results.json").read_text())["rows"] if (out / "results.json").exists() else []
    assert rows == []  # the interrupted point is not a result
