"""`kvtransit sweep --render k8s`: an Indexed Job (one point per index, each pod on a node of its own) that
validates; and `--collect` over the pods' logs writes byte for byte the results file a local sweep writes.

The pod logs here are made the way a pod makes them (`sweep_logs.run_point`, the code `--run-point` runs) by
running the points locally through a stand-in for the Launcher run (deterministic rows and report files), during
the local sweep itself: one run per point gives both the local results file and the log to collect.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kvtransit.cli import build_parser
from kvtransit.cli._common import CliError
from kvtransit.harness.deploy.k8s.sweep_job import (
    POD_SWEEP_DIR,
    SweepJobOptions,
    points_document,
    points_from_document,
    sweep_id,
    sweep_job,
)
from kvtransit.harness.deploy.k8s.sweep_logs import collect, completion_index, run_point
from kvtransit.harness.deploy.k8s.validate import load_directory, problems
from kvtransit.harness.studies.sweep.runner import RESULTS_CSV, RESULTS_JSON, ResultsStore, failed_row, run_sweep
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

BASE = Scenario(requests=8, rate=2.0)
POINTS = [("rate=2", BASE), ("rate=4", replace(BASE, rate=4.0)), ("rate=8", replace(BASE, rate=8.0))]


class FakePointRunner:
    """What PointRunner does, without the live run: a report file under DIR/points/ and a row naming it (floats,
    None and a failed point included, as real rows have)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def __call__(self, key: str, scenario: Scenario) -> dict:
        if scenario.rate == 8.0:
            return failed_row(key, scenario, "middlebox exited with status 1", wall_s=3.25)
        report = self.directory / "points" / f"{key}.json"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps({"point": key, "ttft_s": {"p99": 0.1 * scenario.rate}}, indent=2) + "\n")
        report.with_suffix(".md").write_text(f"# {key}\n")
        row = failed_row(key, scenario, "", wall_s=12.5 + scenario.rate / 3)
        row.update(status="ok", report=str(report), link_busy=scenario.rate / 7, handoff_p99_ms=1 / 3,
                   ttft_p99_ms=100.0 * scenario.rate, tpot_p99_ms=None, slo_attainment=0.9375,
                   goodput_rps=scenario.rate * 0.9, j_per_token=2.5e-3, wire_bytes=123456789, faithful=True,
                   kv_wait_share=0.125, placement="loopback (userspace)")
        return row


def _sweep_with_pod_logs(out: Path, logs: Path) -> None:
    """A local sweep into `out` whose every point is run through the pods' own code, its block saved as a log."""
    logs.mkdir(parents=True, exist_ok=True)
    sid = sweep_id(points_document(POINTS))
    runner = FakePointRunner(out)

    def run_as_a_pod(key: str, scenario: Scenario) -> dict:
        index = [k for k, _ in POINTS].index(key)
        log = io.StringIO("2026-11-30T10:00:00Z launcher: starting\n")
        row = run_point(POINTS, index, out, sid, runner, log)
        log.write("some trailing line\n")
        (logs / f"kvtransit-sweep-{index}-x7k2q.log").write_text(log.getvalue())
        return row

    run_sweep(POINTS, ResultsStore(out), run_as_a_pod)


def test_collect_reproduces_a_local_sweep_s_results_file_byte_for_byte(tmp_path):
    out, logs = tmp_path / "results", tmp_path / "logs"
    _sweep_with_pod_logs(out, logs)
    local = {name: (out / name).read_bytes() for name in (RESULTS_JSON, RESULTS_CSV)}
    reports = {p.relative_to(out): p.read_bytes() for p in (out / "points").iterdir()}
    for name in local:
        (out / name).unlink()
    for path in (out / "points").iterdir():
        path.unlink()
    collected = collect(logs, out)
    assert collected.missing == [] and collected.of == 3
    assert {name: (out / name).read_bytes() for name in local} == local
    assert {p.relative_to(out): p.read_bytes() for p in (out / "points").iterdir()} == reports


def test_collect_reads_logs_from_pods_that_wrote_elsewhere(tmp_path):
    """A pod writes under its own directory; the rows then name the report where the collector put it."""
    pod, logs, out = tmp_path / "pod", tmp_path / "logs", tmp_path / "out"
    logs.mkdir()
    stream = io.StringIO()
    run_point(POINTS, 0, pod, "s1", FakePointRunner(pod), stream)
    (logs / "0.log").write_text(stream.getvalue())
    collected = collect(logs, out)
    assert collected.rows[0]["report"] == str(out / "points" / "rate=2.json")
    assert json.loads((out / "points" / "rate=2.json").read_text())["point"] == "rate=2"
    assert collected.missing == [1, 2]


def _one_block(tmp_path, index: int, sweep: str = "s1", runner=None) -> str:
    stream = io.StringIO()
    run_point(POINTS, index, tmp_path / "pod", sweep, runner or FakePointRunner(tmp_path / "pod"), stream)
    return stream.getvalue()


def test_a_point_logged_twice_alike_counts_once_but_two_different_answers_are_refused(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    block = _one_block(tmp_path, 1)
    (logs / "a.log").write_text(block)
    (logs / "b.log").write_text(block)
    assert len(collect(logs, tmp_path / "out").rows) == 1
    (logs / "b.log").write_text(block.replace('"faithful": true', '"faithful": false'))
    with pytest.raises(ConfigError, match=r"b.log:1: point 1 \(rate=4\) differs from the one in .*a.log"):
        collect(logs, tmp_path / "out2")


def test_logs_of_two_sweeps_are_refused(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text(_one_block(tmp_path, 0, sweep="s1"))
    (logs / "b.log").write_text(_one_block(tmp_path, 1, sweep="s2"))
    with pytest.raises(ConfigError, match="2 different sweeps"):
        collect(logs, tmp_path / "out")


def test_a_block_cut_short_is_named_by_file_and_line(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "cut.log").write_text("noise\n" + _one_block(tmp_path, 0).splitlines()[0] + "\n")
    with pytest.raises(ConfigError, match=r"cut.log:2: .*cut short"):
        collect(logs, tmp_path / "out")


def test_no_blocks_at_all_is_an_error(tmp_path):
    (tmp_path / "empty.log").write_text("nothing here\n")
    with pytest.raises(ConfigError, match="no sweep point"):
        collect(tmp_path, tmp_path / "out")


def test_the_pod_learns_its_point_from_the_completion_index():
    assert completion_index({"JOB_COMPLETION_INDEX": "2"}) == 2
    with pytest.raises(ConfigError, match="JOB_COMPLETION_INDEX"):
        completion_index({})
    with pytest.raises(ConfigError, match="outside the sweep's 3 points"):
        run_point(POINTS, 3, Path("/x"), "s", FakePointRunner(Path("/x")), io.StringIO())


def test_the_points_document_round_trips():
    assert points_from_document(points_document(POINTS), "points.json") == POINTS
    with pytest.raises(ConfigError, match=r"points\.json: not a kvtransit sweep's points"):
        points_from_document('{"points": [{"key": "k"}]}', "points.json")


def test_the_indexed_job_runs_one_point_per_index_each_on_a_node_of_its_own():
    parts = sweep_job(POINTS, SweepJobOptions(nodes=2, links="netns"))
    job = parts["sweep-job.yaml"][0]
    configmap = parts["sweep-points.yaml"][0]
    assert problems([job, configmap]) == []
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 2)
    pod = spec["template"]["spec"]
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    args = pod["containers"][0]["args"]
    assert args[:6] == ["kvtransit", "sweep", "--out", POD_SWEEP_DIR, "--run-point",
                        "/etc/kvtransit/sweep/points.json"]
    assert pod["containers"][0]["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "SYS_ADMIN"]
    assert points_from_document(configmap["data"]["points.json"], "cm") == POINTS


def test_sweep_render_writes_a_valid_base_and_refuses_a_goodput_search(tmp_path, capsys):
    out = tmp_path / "job"
    args = build_parser().parse_args(["sweep", "--render", "k8s", "--out", str(out), "--grid", "rate=2,4",
                                      "--requests", "8", "--preferred-affinity"])
    assert args.func(args) == 0
    assert problems(load_directory(out)) == []
    job = next(iter(yaml.safe_load_all((out / "sweep-job.yaml").read_text())))
    assert job["spec"]["completions"] == 2
    args = build_parser().parse_args(["sweep", "--render", "k8s", "--out", str(tmp_path / "g"), "--goodput-search"])
    with pytest.raises(CliError, match="goodput search"):
        args.func(args)


def test_sweep_collect_cli_writes_results_and_says_what_is_missing(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "0.log").write_text(_one_block(tmp_path, 0))
    args = build_parser().parse_args(["sweep", "--collect", str(logs), "--out", str(tmp_path / "res"), "--no-plots"])
    assert args.func(args) == 1  # points 1 and 2 have no log
    said = capsys.readouterr().out
    assert "missing: no log had point(s) 1, 2 of 3" in said
    assert (tmp_path / "res" / RESULTS_JSON).is_file() and (tmp_path / "res" / "results.md").is_file()
