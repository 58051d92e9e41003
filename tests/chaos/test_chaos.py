"""Faults against a live testbed (real processes on loopback), each judged by the request ledger: nothing lost,
duplicated, cross-delivered or corrupted; every failure with a reason; the ledger agrees with the load
generator's Prometheus counter; and each fault's own checks hold (it really happened, the API refused abuse,
rogue peers were dropped). The catalogue's scenarios run once, side by side (`chaos.run_scenarios`, three testbeds
at once, each its own processes and ports), and each test judges its own: about 12 s a scenario, 5 s of it the
testbed's start, so three at once take the catalogue from ~160 s to about a third on a 2-core box.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from kvtransit.agents.common.kv_frames import MAX_CHUNK_BYTES
from kvtransit.agents.middlebox.app import DEFAULT_INFLIGHT_BYTES
from kvtransit.harness.studies import chaos
from kvtransit.model.serving.workload import generate
from kvtransit.runtime.transport import FlowLimits

# The first test to ask for the catalogue waits for all of it (five rounds of three testbeds).
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

LINK_FAULTS = ["decode-kill", "link-down", "rate-collapse", "corrupt", "reset-peer", "loss", "latency", "slicer",
               "malformed-peer", "control-abuse"]
# The scenario each other catalogue test judges, by test.
SCENARIO_OF = {
    "test_middlebox_killed_mid_transfer_is_restarted_and_its_hand_offs_are_sent_again": "middlebox-kill",
    "test_decode_restart_loses_nothing_and_decode_is_dialled_again": "decode-restart",
    "test_a_stalled_decode_pushes_back_without_unbounded_memory_in_prefill_or_middlebox": "slow-decode",
    "test_a_hand_off_that_never_gets_through_is_given_up_with_a_reason_not_held_forever": "black-hole",
}


async def _black_hole(ctx: chaos.ChaosContext) -> float:
    await ctx.put_fault("black-hole", {"type": "timeout", "timeout_s": 0})  # never removed
    return time.monotonic()


# Not in the product's catalogue: a fault that never lifts, with the prefill's hand-off deadline at 2 s.
BLACK_HOLE = chaos.FaultPlan("black-hole", "writes to decode hang for good", _black_hole, handoff_deadline_s=2.0)
PLANS = {**chaos.SCENARIOS, BLACK_HOLE.name: BLACK_HOLE}
TESTBEDS_AT_ONCE = 3  # each takes ~0.6 of a core (benchmarks/RESULTS.md "Start-up"): three fit two cores


def _scenario_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and item.originalname == "test_a_link_fault_loses_duplicates_and_cross_delivers_nothing":
        return callspec.params["name"]
    return SCENARIO_OF.get(getattr(item, "originalname", ""))


@pytest.fixture(scope="module")
def catalogue(request: pytest.FixtureRequest, tmp_path_factory) -> dict:
    """The scenarios of this module's selected tests, each run once on its own testbed, side by side."""
    wanted = list(dict.fromkeys(name for item in request.session.items if item.module is request.module
                                if (name := _scenario_of(item)) is not None))
    return asyncio.run(chaos.run_scenarios([PLANS[n] for n in wanted], tmp_path_factory.mktemp("chaos"),
                                           chaos.chaos_scenario(), parallel=TESTBEDS_AT_ONCE))


def run(name: str, catalogue: dict) -> chaos.ChaosResult:
    result = catalogue[name]
    if isinstance(result, BaseException):
        raise result
    return result


def assert_nothing_lost(result: chaos.ChaosResult) -> None:
    summary = result.as_json()
    assert summary["requests"] == chaos.DEFAULT_REQUESTS
    assert (summary["lost"], summary["duplicated"], summary["cross_delivered"], summary["corrupted"]) == (0, 0, 0, 0), \
        summary["problems"]
    assert summary["failed_without_reason"] == 0 and summary["counter_mismatches"] == {}, summary["problems"]
    # Recovery means every request ends (ok, slo-miss, or failed with a reason); one left to time out was stuck.
    assert summary["timed_out"] == 0, summary
    assert all(result.checks.values()), result.checks
    total = summary["ok"] + summary["slo_miss"] + sum(summary["failed"].values()) + summary["timed_out"]
    assert total == summary["requests"]


@pytest.mark.parametrize("name", LINK_FAULTS)
def test_a_link_fault_loses_duplicates_and_cross_delivers_nothing(name, catalogue):
    result = run(name, catalogue)
    assert_nothing_lost(result)
    assert result.recovery_s is not None, "no hand-off reached decode after the fault ended"


def test_middlebox_killed_mid_transfer_is_restarted_and_its_hand_offs_are_sent_again(catalogue):
    result = run("middlebox-kill", catalogue)
    assert_nothing_lost(result)
    assert len(result.restarts) == 1 and result.peers["retries"] >= 1
    assert result.recovery_s is not None


def test_decode_restart_loses_nothing_and_decode_is_dialled_again(catalogue):
    result = run("decode-restart", catalogue)
    assert_nothing_lost(result)
    assert len(result.restarts) == 1
    assert result.recovery_s is not None, "no hand-off reached the restarted decode"


def test_a_stalled_decode_pushes_back_without_unbounded_memory_in_prefill_or_middlebox(catalogue):
    result = run("slow-decode", catalogue)
    assert_nothing_lost(result)
    limits = FlowLimits()
    per_connection = limits.read_high_bytes + limits.write_high_bytes + MAX_CHUNK_BYTES
    slack = 48 * 1024 * 1024  # allocator and interpreter noise on top of what the design holds
    # The middlebox holds at most its in-flight budget per prefill connection, plus two connections' buffers.
    middlebox_growth = result.rss_peak_bytes["middlebox"] - result.rss_before_bytes["middlebox"]
    assert middlebox_growth <= DEFAULT_INFLIGHT_BYTES + 2 * per_connection + slack, middlebox_growth
    # The prefill holds each request's KV until it is acked, and nothing more: at most the workload's KV.
    scenario = chaos.chaos_scenario()
    workload_kv = sum(scenario.kv_layout.request_bytes(r.prompt_tokens) for r in generate(scenario.workload))
    prefill_growth = result.rss_peak_bytes["prefill"] - result.rss_before_bytes["prefill"]
    assert prefill_growth <= workload_kv + per_connection + slack, (prefill_growth, workload_kv)


def test_chaos_cli_prints_one_json_object_per_scenario_in_order_with_testbeds_side_by_side(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kvtransit.cli", "chaos", "latency", "slicer", "--parallel", "2",
                           "--json", "--requests", "24", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert [r["scenario"] for r in rows] == ["latency", "slicer"]
    for row in rows:
        assert set(row) >= {"scenario", "requests", "ok", "slo_miss", "failed", "lost", "duplicated",
                            "cross_delivered", "recovery_s"}
        assert row["requests"] == 24 and row["lost"] == 0 and row["passed"], row
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latency", "slicer"]  # a run directory each


@pytest.mark.parametrize("argv,message", [
    (["up", "--model", "nope", "--links", "loopback"], "unknown model 'nope'"),
    (["up", "--rate", "-1", "--links", "loopback"], "rate"),
    (["chaos", "nope"], "unknown chaos scenario 'nope'"),
    (["chaos", "latency", "--requests", "4"], "the faults need 6 s"),
    (["chaos", "latency", "--parallel", "0"], "--parallel must be >= 1"),
    (["middlebox", "--decode", "nohost"], "--decode: expected HOST:PORT"),
    (["loadgen", "--prefill", "127.0.0.1:99999", "--decode-clients", "127.0.0.1:1"], "port must be in 0..65535"),
])
def test_a_bad_config_is_one_line_naming_it_and_starts_nothing(argv, message):
    done = subprocess.run([sys.executable, "-m", "kvtransit.cli", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_hand_off_that_never_gets_through_is_given_up_with_a_reason_not_held_forever(catalogue):
    result = run("black-hole", catalogue)
    summary = result.as_json()
    assert (summary["lost"], summary["duplicated"], summary["cross_delivered"]) == (0, 0, 0), summary["problems"]
    assert summary["failed_without_reason"] == 0
    gave_up = {reason: n for reason, n in summary["failed"].items() if reason.startswith("hand-off gave up")}
    assert gave_up and result.peers["given_up"] == sum(gave_up.values())


@pytest.mark.system
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root")
@pytest.mark.skipif(shutil.which("tc") is None or shutil.which("ip") is None, reason="tc or ip not on PATH")
def test_the_shaped_veth_down_for_two_seconds_then_up_loses_nothing(tmp_path):
    result = asyncio.run(chaos.run_scenario(chaos.SCENARIOS["link-down"], tmp_path, chaos.chaos_scenario(),
                                            links="netns"))
    assert_nothing_lost(result)
    assert result.notes == []  # the veth itself went down, not the loopback stand-in
    assert result.recovery_s is not None
