"""Prefix reuse in the whole serving loop (`kvtransit up` through the Launcher): every process real.

A light system-prompts workload (4 shared 2,048-token system prompts), chosen so that no two requests with
the same system prompt arrive within a second of each other: each one's prefix has been written back before
the next one asks, so the run's hit rate must be exactly what the workload implies, counted here from the
requests themselves.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kvtransit.flows.tier.section import TierSection
from kvtransit.flows.tier.workloads import prefix_requests
from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.scenario import Scenario

pytestmark = pytest.mark.timeout(120)

WORKLOAD = dict(prefix_workload="system-prompts", system_prompts=4, system_prompt_tokens=2048, requests=12,
                rate=2.0, prompt_mean=256.0, prompt_cv=0.5, output_mean=16.0, output_cv=0.5, seed=22, link="eth-25g",
                codec="freq-keep-k")


def _run(tmp_path: Path, **fields) -> dict:
    scenario = Scenario.build(**{**WORKLOAD, **fields})
    launcher = Launcher(scenario, report_path=tmp_path / "run.json", drain_timeout_s=20.0, accuracy_sample=0,
                        figures=False, log=lambda _msg: None, links="loopback")
    path = asyncio.run(launcher.run())
    return json.loads(path.read_text())


def _implied_by_hand(scenario: Scenario) -> float:
    """A request whose system prompt (its first block) was seen before reuses the prompt's 4 whole blocks."""
    seen, cached, total = set(), 0, 0
    for r in prefix_requests(scenario, TierSection.of(scenario)):
        if r.hash_ids[0] in seen:
            cached += 2048
        seen.add(r.hash_ids[0])
        total += r.prompt_tokens
    return cached / total


def test_the_workload_is_light_enough_that_every_repeat_finds_its_prefix_written_back():
    scenario = Scenario.build(**WORKLOAD)
    requests = prefix_requests(scenario, TierSection.of(scenario))
    last: dict[int, float] = {}
    for r in requests:
        if r.hash_ids[0] in last:
            assert r.arrival_s - last[r.hash_ids[0]] > 1.0
        last[r.hash_ids[0]] = r.arrival_s


@pytest.mark.parametrize("mode", ["local", "pool"])
def test_a_run_reuses_exactly_the_prefixes_the_workload_implies(tmp_path, mode):
    report = _run(tmp_path, kv_pool=mode)
    assert report["requests"]["ok"] + report["requests"]["slo_miss"] == WORKLOAD["requests"]
    pool = report["kv_pool"]
    assert pool["mode"] == mode
    assert pool["hit_rate"] == pytest.approx(_implied_by_hand(Scenario.build(**WORKLOAD)), rel=1e-9)
    assert pool["lookups"]["pool-down"] == pool["lookups"]["fetch-failed"] == 0
    split = pool["ttft_split_s"]
    assert split["fetch"] + split["compute"] == pytest.approx(report["ttft_s"]["mean"])
    if mode == "pool":
        # Fetched compact: freq-keep-k keeps half the values (and 4 sink tokens a 512-token block).
        assert pool["fetch_wire_bytes"] / pool["fetch_raw_bytes"] == pytest.approx(0.5, abs=0.02)
        assert pool["pool"]["tiers"]["memory"]["blocks"] > 0 and split["fetch"] > 0
        # Fetches and write-backs crossed the pool link and the module: their energy is in the report's.
        relay = next(a["pool_relay"] for a in report["run"]["agents"] if a["role"] == "middlebox")
        link_j = ((relay["fetch_wire_bytes"] + relay["put_wire_bytes"]) / report["config"]["effective_scale"]
                  * 8 * 15e-12)  # eth-25g: 15 pJ per wire bit (docs/reference.md §5)
        assert report["energy_j"]["pool"] == pytest.approx(link_j + relay["module_energy_j"]) and link_j > 0
    else:
        assert pool["fetch_raw_bytes"] == 0 and split["fetch"] == 0
        assert report["energy_j"]["pool"] is None  # the local index moves nothing over a link


def test_without_the_flag_nothing_changes(tmp_path):
    report = _run(tmp_path, requests=4)
    assert report["kv_pool"] is None
    assert all(agent["role"] != "kvpool" and "prefix" not in agent for agent in report["run"]["agents"])
