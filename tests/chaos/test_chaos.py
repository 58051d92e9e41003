"""Faults against a live testbed (real processes on loopback), each judged by the request ledger: nothing lost,
duplicated, cross-delivered or corrupted; every failure with a reason; the ledger agrees with the load
generator's Prometheus counter; and each fault's own checks hold (it really happened, the API refused abuse,
rogue peers were dropped). About 8 s a scenario on a 2-core box.
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

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]


def run(name: str, tmp_path) -> chaos.ChaosResult:
    return asyncio.run(chaos.run_scenario(chaos.SCENARIOS[name], tmp_path / name, chaos.chaos_scenario()))


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


@pytest.mark.parametrize("name", ["decode-kill", "link-down", "rate-collapse", "corrupt", "reset-peer", "loss",
                                  "latency", "slicer", "malformed-peer", "control-abuse"])
def test_a_link_fault_loses_duplicates_and_cross_delivers_nothing(name, tmp_path):
    result = run(name, tmp_path)
    assert_nothing_lost(result)
    assert result.recovery_s is not None, "no hand-off reached decode after the fault ended"


def test_middlebox_killed_mid_transfer_is_restarted_and_its_hand_offs_are_sent_again(tmp_path):
    result = run("middlebox-kill", tmp_path)
    assert_nothing_lost(result)
    assert len(result.restarts) == 1 and result.peers["retries"] >= 1
    assert result.recovery_s is not None


def test_decode_restart_loses_nothing_and_decode_is_dialled_again(tmp_path):
    result = run("decode-restart", tmp_path)
    assert_nothing_lost(result)
    assert len(result.restarts) == 1
    assert result.recovery_s is not None, "no hand-off reached the restarted decode"


def test_a_stalled_decode_pushes_back_without_unbounded_memory_in_prefill_or_middlebox(tmp_path):
    result = run("slow-decode", tmp_path)
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


def test_chaos_cli_prints_one_json_object_per_scenario(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kvtransit.cli", "chaos", "latency", "--json", "--requests", "24",
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert [r["scenario"] for r in rows] == ["latency"]
    assert set(rows[0]) >= {"scenario", "requests", "ok", "slo_miss", "failed", "lost", "duplicated",
                            "cross_delivered", "recovery_s"}
    assert rows[0]["requests"] == 24 and rows[0]["lost"] == 0 and rows[0]["passed"]


@pytest.mark.parametrize("argv,message", [
    (["up", "--model", "nope", "--links", "loopback"], "unknown model 'nope'"),
    (["up", "--rate", "-1", "--links", "loopback"], "rate"),
    (["chaos", "nope"], "unknown chaos scenario 'nope'"),
    (["chaos", "latency", "--requests", "4"], "the faults need 6 s"),
    (["middlebox", "--decode", "nohost"], "--decode: expected HOST:PORT"),
    (["loadgen", "--prefill", "127.0.0.1:99999", "--decode-clients", "127.0.0.1:1"], "port must be in 0..65535"),
])
def test_a_bad_config_is_one_line_naming_it_and_starts_nothing(argv, message):
    done = subprocess.run([sys.executable, "-m", "kvtransit.cli", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_hand_off_that_never_gets_through_is_given_up_with_a_reason_not_held_forever(tmp_path):
    async def black_hole(ctx: chaos.ChaosContext) -> float:
        await ctx.put_fault("black-hole", {"type": "timeout", "timeout_s": 0})  # never removed
        return time.monotonic()

    plan = chaos.FaultPlan("black-hole", "writes to decode hang for good", black_hole)
    result = asyncio.run(chaos.run_scenario(plan, tmp_path, chaos.chaos_scenario(), handoff_deadline_s=2.0))
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
