"""The serving loop end to end: real decode, prefill and load-generator processes on loopback.

Every process is the real one, the middlebox included. Workloads are short (seconds) and light, so nothing
queues and the measured figures can be held against the analytic ones. Tolerances are generous: the 2-core
box is shared.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from kvtransit.agents.common import kv_frames
from kvtransit.harness.up.launcher import Launcher, RunFailed
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.cost.roofline import decode_step_s
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import REPORT_KEYS
from tests.integration._light_run import LIGHT, LIGHT_ACCURACY_SAMPLE

pytestmark = pytest.mark.timeout(120)

# The light run's workload (tests/integration/conftest.py runs it once; test_request_ledger.py reads it too).
# freq-keep-k compressed at the prefill GPU, four requests: the compress-at tests' run.
GPU_FIELDS = dict(LIGHT, requests=4, codec="freq-keep-k", compress_at="gpu")


def _run(tmp_path: Path, name: str, stop_after_s: float | None = None, on_started=None, middlebox=None,
         **fields) -> tuple[Launcher, dict | None]:
    scenario = Scenario.build(**fields)
    launcher = Launcher(scenario, figures=False, report_path=tmp_path / f"{name}.json", middlebox_command=middlebox,
                        drain_timeout_s=20.0, accuracy_sample=4, log=lambda _msg: None)

    async def main():
        stop = asyncio.Event()
        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, stop.set)
        hook = asyncio.create_task(on_started(launcher)) if on_started is not None else None
        try:
            return await launcher.run(stop)
        finally:
            if hook is not None:
                hook.cancel()

    path = asyncio.run(main())
    return launcher, (json.loads(path.read_text()) if path else None)


@pytest.fixture(scope="module")
def light_run(light_loopback_run):
    """The session's light run of codec none (tests/integration/conftest.py), every test below reading its report."""
    return light_loopback_run.report


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    """Four requests of freq-keep-k compressed at the prefill GPU: what the two compress-at tests below both judge
    (the same scenario, run once; they only read its report)."""
    return _run(tmp_path_factory.mktemp("gpu"), "gpu", **GPU_FIELDS)[1]


def _simulator_stream(seed: int, rate: float, n: int, prompt=(1024.0, 0.5), output=(32.0, 0.5)):
    """docs/reference.md §4's generator, written out again here independently of model.workload."""
    rng = random.Random(seed)

    def lognormal(mean, cv):
        s2 = math.log(1 + cv * cv)
        return int(min(32768, max(1, round(rng.lognormvariate(math.log(mean) - s2 / 2, math.sqrt(s2))))))

    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append((i, t, lognormal(*prompt), lognormal(*output)))
    return out


def test_every_request_is_accounted_for(light_run):
    req = light_run["requests"]
    assert req["total"] == LIGHT["requests"]
    assert req["ok"] + req["slo_miss"] + req["failed"] + req["timed_out"] == req["total"]
    assert [r["id"] for r in light_run["per_request"]] == list(range(LIGHT["requests"]))
    assert req["failed"] == 0 and req["timed_out"] == 0, req


def test_report_has_every_key(light_run):
    assert set(REPORT_KEYS) <= set(light_run)
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "handoff_s"):
        assert set(light_run[key]) == {"mean", "p50", "p90", "p99", "max"}
    assert set(light_run["requests"]) >= {"total", "ok", "slo_miss", "failed", "failed_reasons"}
    assert set(light_run["link"]) >= {"busy", "configured_Bps", "achieved_Bps", "kv_bytes", "wire_bytes"}
    assert set(light_run["energy_j"]) == {"link", "module", "gpu", "pool", "remote_kv"}
    assert light_run["j_per_token"] > 0
    assert light_run["energy_j"]["pool"] is None  # no KV tier in this run
    assert light_run["energy_j"]["remote_kv"] is None  # nor remote KV
    assert isinstance(light_run["faithful"], bool) and "link_rate" in light_run["fidelity"]
    assert light_run["accuracy"]["sampled_requests"] == LIGHT_ACCURACY_SAMPLE == 4
    assert light_run["accuracy"]["k_relative_error"] == 0.0  # codec none: the bytes arrived intact


def test_handoffs_on_an_idle_loopback_link_match_the_model_at_light_load(light_run):
    """Each hand-off that found the link idle, measured at the client, over latency + bytes / bw: the median
    within 2 % (a noisy 2-core box may stretch the tail; it is reported, not judged)."""
    check = light_run["fidelity"]["handoff_model"]
    dist = check["distribution"]
    assert dist["handoffs"] == LIGHT["requests"] and dist["idle_handoffs"] >= LIGHT["requests"] // 2, dist
    # The check's own rule (2 %, or 1 ms for short hand-offs): a second copy without the 1 ms arm failed on a
    # CI box at 1.020x (tests/system/test_up_netns.py); the median is held to the light-load band besides.
    assert check["ok"], check
    assert 0.90 <= dist["ratio"]["p50"] <= 1.10, dist
    assert not light_run["errors"]


def test_slo_attainment_is_full_at_light_load(light_run):
    assert light_run["slo_attainment"] == 1.0


def test_workload_is_the_simulators_stream_for_seed_1(light_run):
    expected = _simulator_stream(1, LIGHT["rate"], LIGHT["requests"])
    got = [(r["id"], r["prompt_tokens"], r["output_tokens"]) for r in light_run["per_request"]]
    assert got == [(i, p, o) for i, _, p, o in expected]
    lag = [r["arrival_s"] - t for r, (_, t, _, _) in zip(light_run["per_request"], expected, strict=True)]
    assert all(0 <= x < 0.05 for x in lag), lag  # sent on its arrival time (absolute deadlines)


def _analytic_handoff(scenario: Scenario, prompt_tokens: int, ratio: float = 1.0) -> float:
    link = scenario.link_spec
    return link.latency_s + scenario.model_spec.kv_bytes(prompt_tokens) / ratio / link.bandwidth_Bps


def test_handoff_matches_latency_plus_bytes_over_bandwidth(light_run):
    scenario = Scenario.build(codec="none", **LIGHT)
    ratios = [r["handoff_s"] / _analytic_handoff(scenario, r["prompt_tokens"]) for r in light_run["per_request"]
              if r["handoff_s"] is not None]
    assert len(ratios) >= LIGHT["requests"] - 2  # single-token outputs have no hand-off
    # Same order as latency + bytes/bandwidth (a wrong scale or pacing is off by far more); the 2 % target is
    # the fidelity guard's to judge, run by run, on a box that others share.
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.10), ratios


def test_tpot_is_the_roofline_decode_steps_plus_the_handoff_share(light_run):
    scenario = Scenario.build(codec="none", **LIGHT)
    model, device = scenario.model_spec, scenario.device_spec
    ratios = []
    for r in light_run["per_request"]:
        n = r["output_tokens"]
        if n < 2 or r["handoff_s"] is None:
            continue
        steps = sum(decode_step_s(model, device, 1, 1, r["prompt_tokens"] + k) for k in range(1, n))
        ratios.append(r["tpot_s"] / ((r["handoff_s"] + steps) / (n - 1)))
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.05), ratios


def test_kv_wait_share_is_the_mean_of_hand_off_plus_decode_queue_wait_over_e2e(light_run):
    """Decode's queue wait reaches every taken request's record, and the report's share is recomputed from the
    per-request figures (steady window: the first 10 % by arrival left out; one-token outputs have no share)."""
    taken = [r for r in light_run["per_request"] if r["handoff_s"] is not None]
    assert taken and all(r["decode_wait_s"] is not None and r["decode_wait_s"] >= 0 for r in taken), taken
    steady = sorted(light_run["per_request"], key=lambda r: r["arrival_s"])[LIGHT["requests"] // 10:]
    shares = [(r["handoff_s"] + r["decode_wait_s"]) / r["e2e_s"] for r in steady
              if r["output_tokens"] >= 2 and r["e2e_s"] and r["handoff_s"] is not None]
    assert light_run["kv_wait_share"] == pytest.approx(statistics.fmean(shares))
    assert 0 < light_run["kv_wait_share"] < 1


def test_every_request_is_set_beside_its_twin_and_the_twin_explains_the_run(light_run):
    """The harness ran the scenario's twin and joined it in (twin/diff.py): every request has the twin's figures, the
    two ended the same, and on a light run the live E2E departs from the twin's by a small part of it (the twin has
    no timer lateness, no host, no TCP: those few milliseconds are what the diff is there to show)."""
    twin = light_run["twin"]
    finished = [r for r in light_run["per_request"] if r["e2e_s"] is not None]
    assert all(r["twin"] is not None and r["twin"]["outcome"] == r["outcome"] for r in light_run["per_request"])
    assert twin["compared"] == len(finished) and twin["outcomes_differ"] == []
    assert twin["summary"]["slo_attainment"]["live"] == twin["summary"]["slo_attainment"]["twin"]
    twin_e2e = sorted(r["twin"]["e2e_s"] for r in finished)[len(finished) // 2]
    assert abs(twin["delta_s"]["e2e_s"]["p50"]) <= 0.10 * twin_e2e
    assert set(twin["stage_share"]) == {"prefill", "link", "decode admission", "decode steps"}


def test_a_live_run_draws_its_figures_beside_its_report_the_twins_where_they_part_among_them(light_loopback_run):
    """The one live run of the suite that draws its figures (the others pass `figures=False`: report/plots.py is
    pinned on reports in tests/unit/test_report_figures.py); the harness draws them after the run, twin included."""
    figures = light_loopback_run.report["figures"]
    assert "twin_departure" in {f["name"] for f in figures} and len(figures) >= 5, figures
    for figure in figures:
        path = light_loopback_run.report_path.parent / figure["file"]
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path


def test_compress_at_gpu_puts_the_codecs_own_bytes_on_the_wire(gpu_run):
    """The wire carries exactly what the codec makes of each request's KV (computed here independently);
    in transit the real middlebox must put the same bytes on the link."""
    report = gpu_run
    scenario = Scenario.build(**GPU_FIELDS)
    layout = scenario.kv_layout
    kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed)
    codec = kv_frames.codec_for(scenario)
    wire = raw = 0
    for r in report["per_request"]:
        if r["output_tokens"] < 2:
            continue
        for layer in range(layout.layers):
            rows = kv_frames.as_rows(kv.layer(r["id"], layer, r["prompt_tokens"]))
            wire += codec.encode(rows).payload.nbytes
            raw += rows.nbytes
    assert report["requests"]["ok"] == 4
    assert report["link"]["wire_bytes"] == pytest.approx(wire / scenario.effective_scale)
    assert report["link"]["kv_bytes"] == pytest.approx(raw / scenario.effective_scale)
    assert report["link"]["kv_bytes"] / report["link"]["wire_bytes"] == pytest.approx(2.0, rel=0.05)  # keep 0.5
    k_err, v_err = report["accuracy"]["k_relative_error"], report["accuracy"]["v_relative_error"]
    assert 0 < k_err < v_err < 1  # measured on the decoded KV: K is smoother than V
    # Beside it, the equal-bytes baseline (ratio 2: fp8 per-block) on the same sampled tensors: far better here.
    assert report["accuracy"]["baseline_codec"] == "fp8"
    assert 0 < report["accuracy"]["baseline_k_relative_error"] < k_err
    assert 0 < report["accuracy"]["baseline_v_relative_error"] < v_err
    assert report["verdict"]["verdict"] == "no kernel"  # the codec ran on the GPU: no kernel on the link


def test_compress_at_gpu_and_in_transit_put_the_same_bytes_on_the_wire(gpu_run, tmp_path):
    """With the real middlebox: the codec at the prefill GPU (middlebox passes through) or in the module."""
    gpu = gpu_run
    _, transit = _run(tmp_path, "transit", middlebox=None, **{**GPU_FIELDS, "compress_at": "transit"})
    for report in (gpu, transit):
        assert report["requests"]["ok"] + report["requests"]["slo_miss"] == 4
    assert gpu["link"]["wire_bytes"] == transit["link"]["wire_bytes"]
    assert gpu["link"]["kv_bytes"] == transit["link"]["kv_bytes"]
    assert transit["energy_j"]["module"] > 0 == gpu["energy_j"]["module"]  # the module only spends in transit


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for an init that does not reap counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_crashed_process_stops_the_run_and_the_report_keeps_what_completed(tmp_path):
    async def kill_decode(launcher):
        # The launcher makes the load generator's Child last, so there is no event to wait on before that.
        while not any(c.role == "loadgen" and c.ready for c in launcher.children):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)
        decode = next(c for c in launcher.children if c.role == "decode")
        os.kill(decode.pid, signal.SIGKILL)

    with pytest.raises(RunFailed, match=r"decode-0 \(pid \d+\) was killed by signal 9") as failure:
        _run(tmp_path, "crash", on_started=kill_decode, codec="none", **dict(LIGHT, requests=40))
    report = json.loads((tmp_path / "crash.json").read_text())
    req = report["requests"]
    assert req["total"] == 40 and req["ok"] + req["slo_miss"] >= 1
    assert req["failed"] + req["timed_out"] >= 1
    assert "stderr" in str(failure.value)


def test_stopping_the_run_stops_every_child_and_writes_the_report(tmp_path):
    launcher, report = _run(tmp_path, "stopped", stop_after_s=6.0, codec="none", **dict(LIGHT, requests=200))
    assert report is not None and report["requests"]["total"] == 200
    assert report["requests"]["timed_out"] >= 1  # stopped early: the rest are timed out, not vanished
    assert all(not _alive(c.pid) for c in launcher.children)


def test_a_port_in_use_names_the_port_and_the_flag():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "kvtransit.cli", "decode", "--listen", f"127.0.0.1:{port}"],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        (f"kvtransit decode: error: port 127.0.0.1:{port} is already in use (move it with --listen HOST:PORT, "
         "port 0 picks a free one)")]


def test_an_unknown_value_is_one_line_with_the_choices():
    result = subprocess.run([sys.executable, "-m", "kvtransit.cli", "up", "--codec", "zip"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("kvtransit up: error: codec: unknown value 'zip' (choose from: none, fp8, "
                                     "fp4-block, freq-keep-k, kivi-2, kivi-3)")


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_ctrl_c_on_kvtransit_up_stops_every_child_and_still_reports(tmp_path):
    import time

    report = tmp_path / "up.json"
    up = subprocess.Popen([sys.executable, "-m", "kvtransit.cli", "up", "--links", "loopback", "--no-progress",
                           "--no-figures", "--requests", "200", "--output-mean", "32", "--report", str(report)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        children: list[int] = []
        while time.monotonic() < deadline and len(children) < 4:  # decode, middlebox, prefill, loadgen
            time.sleep(0.2)
            children = _children_of(up.pid)
        assert len(children) == 4, children
        time.sleep(3.0)
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 130, err
    assert all(not _alive(pid) for pid in children)
    data = json.loads(report.read_text())
    assert data["requests"]["total"] == 200 and data["requests"]["timed_out"] >= 1
    assert "TTFT" in out and f"report: {report}" in out


def test_children_stop_by_themselves_when_the_launcher_is_killed_outright(tmp_path):
    import time

    up = subprocess.Popen([sys.executable, "-m", "kvtransit.cli", "up", "--links", "loopback", "--no-progress",
                           "--no-figures", "--requests", "200", "--output-mean", "32", "--report",
                           str(tmp_path / "killed.json")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(children) < 4:
            time.sleep(0.2)
            children = _children_of(up.pid)
        assert len(children) == 4, children
    finally:
        up.kill()  # SIGKILL: no chance to stop anyone
        up.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.2)
    leftovers = [pid for pid in children if _alive(pid)]
    for pid in leftovers:  # never leave them behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not leftovers
