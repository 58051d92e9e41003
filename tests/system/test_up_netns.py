"""`kvtransit up --links netns`: the middlebox and decode in network namespaces, tc tbf shaping the hand-off veth.

A short, light run through the real CLI (as a person runs it), then its report is held against the analytic
hand-off (latency + bytes / bandwidth, as tests/integration/test_serving_loop.py does on loopback), and the
host is checked for leftovers by the exact names the run's manifest lists. Failures while building the
topology or starting an agent must leave nothing behind either.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from kvtransit.harness.up.launcher import Launcher, RunFailed
from kvtransit.harness.up.placement import LinksUnavailable, choose_links
from kvtransit.model.scenario import Scenario
from kvtransit.shaping.errors import CommandFailed
from kvtransit.shaping.runner import run_command

pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root"),
    pytest.mark.skipif(shutil.which("tc") is None or shutil.which("ip") is None, reason="tc or ip not on PATH"),
]

# The light load of tests/integration/test_serving_loop.py: requests rarely meet, so a hand-off is one transfer.
LIGHT = dict(rate=2.0, requests=10, output_mean=32.0, output_cv=0.5, prompt_mean=1024.0, prompt_cv=0.5)
LIGHT_FLAGS = ["--rate", "2", "--requests", "10", "--output-mean", "32", "--output-cv", "0.5", "--prompt-mean",
               "1024", "--prompt-cv", "0.5", "--codec", "none"]


def _leftovers(manifest_path: Path) -> list[str]:
    """Every namespace and veth the manifest lists that still exists (by exact name)."""
    manifest = json.loads(manifest_path.read_text())
    namespaces = {line.split()[0] for line in run_command(["ip", "netns", "list"]).splitlines() if line.strip()}
    left = []
    for item in manifest["resources"]:
        if item["kind"] == "netns" and item["name"] in namespaces:
            left.append(f"netns {item['name']}")
        if item["kind"] == "veth":
            for ns, dev in ((item["netns"], item["dev"]), (item["peer_netns"], item["peer"])):
                if ns is None or ns in namespaces:
                    listing = run_command(["ip", *(["-n", ns] if ns else []), "-o", "link", "show"])
                    if any(line.split(":")[1].strip().split("@")[0] == dev for line in listing.splitlines()):
                        left.append(f"veth {dev} in {ns or 'the root namespace'}")
    return left


@pytest.fixture(scope="module")
def netns_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("netns")
    report = tmp / "report.json"
    done = subprocess.run([sys.executable, "-m", "kvtransit.cli", "up", "--links", "netns", "--no-progress",
                           "--drain-timeout", "20", "--report", str(report), *LIGHT_FLAGS],
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text()), done.stdout, report.with_suffix(".run") / "links.json"


def test_every_request_is_accounted_for_in_netns_mode(netns_run):
    report, _, _ = netns_run
    req = report["requests"]
    assert req["total"] == LIGHT["requests"]
    assert req["ok"] + req["slo_miss"] == req["total"], req
    assert [r["id"] for r in report["per_request"]] == list(range(LIGHT["requests"]))


def test_the_report_and_the_output_say_tc_shaped_the_rate(netns_run):
    report, stdout, _ = netns_run
    assert report["config"]["links"]["mode"] == "netns"
    assert report["link"]["backends"]["rate"] in ("tc tbf", "tc htb")
    assert report["link"]["backends"]["delay"] == "userspace"  # the middlebox's delay line (no netem here)
    assert report["link"]["measured_at"] == "decode"  # tc's side of the link is invisible to the middlebox
    assert "links: netns" in stdout and f"rate by {report['link']['backends']['rate']}" in stdout


# The hand-off through tbf is held to the same band as on loopback (test_serving_loop): the prefill sends the
# KV during its step, stamped with the first token, and the middlebox holds it until then and by tbf's burst
# time, so neither the host's overhead nor tbf's full bucket after idle moves the end of the transfer.
# Measured here: median 1.007-1.012x (loopback 1.006-1.008x); before those two holds, 1.13-1.25x.
NETNS_HANDOFF_BOUNDS = (0.90, 1.10)


def test_handoff_through_tc_is_latency_plus_bytes_over_bandwidth(netns_run):
    report, _, _ = netns_run
    scenario = Scenario.build(codec="none", **LIGHT)
    link = scenario.link_spec
    ratios = [r["handoff_s"] / (link.latency_s + scenario.model_spec.kv_bytes(r["prompt_tokens"]) / link.bandwidth_Bps)
              for r in report["per_request"] if r["handoff_s"] is not None]
    assert len(ratios) >= LIGHT["requests"] - 2  # single-token outputs have no hand-off
    low, high = NETNS_HANDOFF_BOUNDS
    assert low <= statistics.median(ratios) <= high, ratios


def test_the_reports_handoff_check_holds_through_tc_at_light_load(netns_run):
    """The report's own judgement of the same figure: hand-offs that found the link idle, median within 2 % of
    latency + bytes / bw, the distribution in `fidelity.handoff_model`."""
    report, _, _ = netns_run
    check = report["fidelity"]["handoff_model"]
    dist = check["distribution"]
    assert dist["idle_handoffs"] >= LIGHT["requests"] // 2, dist
    # The check's own rule (median within 2 %, or within 1 ms for short hand-offs: a light run's median
    # hand-off is ~40 ms, so a CI box once measured 1.020x and the check rightly passed it on the 1 ms arm).
    assert check["ok"], check
    low, high = NETNS_HANDOFF_BOUNDS
    assert low <= dist["ratio"]["p50"] <= high, check
    assert not report["errors"]


def test_no_namespace_or_veth_of_the_run_remains(netns_run):
    _, _, manifest = netns_run
    listed = json.loads(manifest.read_text())["resources"]
    assert {item["kind"] for item in listed} == {"netns", "veth", "qdisc"}  # the manifest did list the run
    assert _leftovers(manifest) == []


def test_a_failure_while_building_the_topology_leaves_nothing_behind(tmp_path):
    def fail_on_shaping(argv):
        if argv[0] == "tc" and "add" in argv:  # the last step: namespaces and veths exist by now
            raise CommandFailed(argv, 2, "injected failure")
        return run_command(argv)

    manifest = tmp_path / "links.json"
    with pytest.raises(LinksUnavailable, match=r"rolled back.*injected failure.*links clean --manifest"):
        choose_links(Scenario.build(**LIGHT), "netns", manifest_path=manifest, runner=fail_on_shaping)
    assert [item["kind"] for item in json.loads(manifest.read_text())["resources"]][-1] == "veth"
    assert _leftovers(manifest) == []


def test_an_agent_that_fails_to_start_in_a_namespace_leaves_nothing_behind(tmp_path):
    broken_middlebox = [sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"]
    launcher = Launcher(Scenario.build(**LIGHT), report_path=tmp_path / "r.json", middlebox_command=broken_middlebox,
                        figures=False, links="netns", log=lambda _line: None)
    with pytest.raises(RunFailed, match=r"(?s)middlebox-0 failed to start.*boom"):
        asyncio.run(launcher.run())
    assert _leftovers(tmp_path / "r.run" / "links.json") == []
