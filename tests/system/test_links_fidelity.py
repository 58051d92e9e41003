"""Real namespaces, real veths, real tc: achieved goodput and added latency against what was configured.

Each measurement builds its own `kvt<6hex>-` namespace pair and removes it (run_link_test's finally); the
tests that build by hand delete by exact name in their own finally. Tolerances are the issue's: goodput
within 5 %, added latency within 1 ms. A noisy 2-core box can starve the sender for a moment, which only ever
lowers the achieved rate; each goodput case therefore gets one more try before it fails (never a pass by luck:
a shaper that overshoots fails both).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from kvtransit.shaping.backend import probe
from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.linktest import run_link_test
from kvtransit.shaping.manifest import existing_namespaces
from kvtransit.shaping.runner import run_command
from kvtransit.shaping.spec import LinkSpec
from kvtransit.shaping.topology import LinkPlan, build_testbed

pytestmark = pytest.mark.system

if os.geteuid() != 0:
    pytest.skip("needs root for network namespaces and tc", allow_module_level=True)
if not (shutil.which("tc") and shutil.which("ip")):
    pytest.skip("needs iproute2's tc and ip on PATH", allow_module_level=True)

GOODPUT_TOLERANCE = 0.05  # the issue's ±5 %
LATENCY_TOLERANCE_S = 0.001  # the issue's ±1 ms
SECONDS = 1.5  # after the 0.5 s warm-up: 2 s per transfer keeps the file well under a minute


@pytest.fixture(scope="module")
def caps():
    found = probe()
    if not found.kernel_shaping:
        pytest.skip(f"this kernel has neither tbf nor htb: {found.notes}")
    return found


@pytest.mark.parametrize("rate", ["100mbit", "500mbit", "2gbit"])
def test_tcp_goodput_matches_the_configured_rate(caps, rate):
    spec = LinkSpec.parse(rate=rate)
    ratios = []
    for _attempt in range(2):
        result = run_link_test(spec, seconds=SECONDS, capabilities=caps)
        ratios.append(result["achieved_bps"] / result["configured_bps"])
        if abs(ratios[-1] - 1) <= GOODPUT_TOLERANCE:
            break
    assert abs(ratios[-1] - 1) <= GOODPUT_TOLERANCE, f"{rate}: achieved/configured {ratios}"


@pytest.mark.parametrize("latency", ["5ms", "20ms"])
def test_added_latency_matches_the_configured_delay(caps, latency):
    spec = LinkSpec.parse(latency=latency)
    result = run_link_test(spec, rtt_count=60, capabilities=caps)
    assert result["backends"]["latency"] == ("netem" if caps.netem else "userspace")
    assert result["achieved_latency_s"] == pytest.approx(spec.latency_s, abs=LATENCY_TOLERANCE_S), result


def test_probe_finds_a_rate_qdisc_and_leaves_no_namespace(caps):
    before = existing_namespaces(run_command)
    again = probe()
    assert again.qdiscs == caps.qdiscs and again.rate_qdisc in ("tbf", "htb")
    assert existing_namespaces(run_command) == before


def test_a_crashed_run_is_cleaned_from_its_manifest_by_the_cli(caps, tmp_path):
    manifest = tmp_path / "links.json"
    bed = build_testbed(["mb", "dec"], [LinkPlan("mb", "dec", LinkSpec.parse(rate="100mbit"))],
                        capabilities=caps, manifest_path=manifest)
    names = set(bed.namespaces.values())
    try:
        assert names <= existing_namespaces(run_command)
        # "Crash": the handle is dropped; a separate process cleans up from the file alone.
        done = subprocess.run([sys.executable, "-m", "kvtransit.cli", "links", "clean", "--manifest", str(manifest)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert not names & existing_namespaces(run_command)
    finally:
        bed.cleanup()  # a no-op when the CLI did its job


def test_a_clashing_namespace_name_fails_before_anything_is_created(caps):
    run_id = "kvtc1a5h-"
    squatter = f"{run_id}dec"
    run_command(["ip", "netns", "add", squatter])
    try:
        before = existing_namespaces(run_command)
        with pytest.raises(ShapingError, match="already exists"):
            build_testbed(["mb", "dec"], [LinkPlan("mb", "dec")], capabilities=caps, run_id=run_id)
        assert existing_namespaces(run_command) == before
    finally:
        run_command(["ip", "netns", "del", squatter])


def test_a_failing_tc_command_rolls_back_everything_it_made(caps):
    # A queue limit of 3 GB is valid for the spec but beyond what tbf accepts: tc fails after the namespaces
    # and veth exist, and the build must remove them.
    spec = LinkSpec(rate_Bps=1e6, limit_bytes=2**32 + 1)
    before = existing_namespaces(run_command)
    with pytest.raises(ShapingError) as info:
        build_testbed(["mb", "dec"], [LinkPlan("mb", "dec", spec)], capabilities=caps)
    assert "tc" in str(info.value)
    assert existing_namespaces(run_command) == before
