"""A sweep's pods, for real, and `kvtransit sweep --collect`: each point is run by the very command an Indexed
Job's pod runs (`kvtransit sweep --run-point`, JOB_COMPLETION_INDEX set, the real testbed on loopback), its stdout
kept as that pod's log, and its row recorded by the local sweep's own writer. Collected from the logs alone, the
results file comes out byte for byte the same, reports included."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from kvtransit.harness.deploy.k8s.sweep_job import points_document
from kvtransit.harness.deploy.k8s.sweep_logs import collect, parse_log
from kvtransit.harness.studies.sweep.runner import RESULTS_CSV, RESULTS_JSON, ResultsStore, run_sweep
from kvtransit.model.scenario import Scenario

# The collected results equal the local ones byte for byte: what happened, not how fast (tests/conftest.py).
pytestmark = [pytest.mark.timeout(240), pytest.mark.shares_host]

# Short and light, as tests/integration/test_sweep_live.py runs its points (faithful on a busy 2-core box).
TINY = Scenario(codec="none", requests=4, rate=2.0, prompt_mean=1024.0, output_mean=16.0, scale=0.02, dilation=2.0)
POINTS = [("rate=2", TINY), ("rate=4", replace(TINY, rate=4.0))]


def test_collected_pod_logs_reproduce_the_local_results_file(tmp_path):
    out, logs = tmp_path / "sweep", tmp_path / "logs"
    logs.mkdir()
    points_file = tmp_path / "points.json"
    points_file.write_text(points_document(POINTS))

    def run_as_a_pod(key, _scenario):
        index = [k for k, _ in POINTS].index(key)
        done = subprocess.run(
            [sys.executable, "-m", "kvtransit.cli", "sweep", "--run-point", str(points_file), "--out", str(out),
             "--links", "loopback", "--accuracy-sample", "0", "--drain-timeout", "10"],
            env={**os.environ, "JOB_COMPLETION_INDEX": str(index)}, capture_output=True, text=True, timeout=200)
        assert done.returncode == 0, done.stderr[-2000:]
        (logs / f"kvtransit-sweep-{index}.log").write_text(done.stdout)
        (block,) = parse_log(done.stdout, f"pod {index}")
        return block.row

    run_sweep(POINTS, ResultsStore(out), run_as_a_pod)
    local = {name: (out / name).read_bytes() for name in (RESULTS_JSON, RESULTS_CSV)}
    reports = {p.name: p.read_bytes() for p in (out / "points").iterdir() if p.is_file()}
    assert len(reports) == 4, sorted(reports)  # each point's report, JSON and Markdown (its run directory beside them)
    for path in [out / RESULTS_JSON, out / RESULTS_CSV, *(out / "points" / name for name in reports)]:
        path.unlink()

    collected = collect(logs, out)

    assert collected.missing == []
    assert [row["status"] for row in collected.rows] == ["ok", "ok"], [row["error"] for row in collected.rows]
    assert {name: (out / name).read_bytes() for name in local} == local
    assert {p.name: p.read_bytes() for p in (out / "points").iterdir() if p.is_file()} == reports
