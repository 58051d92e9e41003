"""`kvtransit up --ring-share`: ring attention on one clock with the hand-off.

Real processes on loopback: a share of the requests has a long prompt that the prefill (rank 0) and its ring's
follower rank processes prefill together, each hop a real block of KV at the run's scale over the shaped ring link
while its blockwise attention is held; the rest of the requests are ordinary. The report's `ring` block and its
fidelity check measure the ring requests' attention beside the model's; a follower that dies fails the ring
requests with the ring's reason, and every other request still completes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from kvtransit.flows.ring.section import RingSection
from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.judge import ledger_check
from kvtransit.model.scenario import Scenario
from tests.integration._launcher_stats import until_stats

pytestmark = pytest.mark.timeout(240)

# Light load with a third of the requests a 4,096-token prompt a ring of 2 prefills over eth-100g (a hop of a
# 2,048-token block: 0.7 ms of link, link-bound, flows/ring/ring_class.py) at a dilation this host carries a ring's hops
# at (a loopback hop in Python costs ~0.3 ms on the 2-core box, benchmarks/RESULTS.md "Ring attention").
LIGHT = dict(ring_share=0.34, ring_ranks=2, ring_prompt=4096, ring_link="eth-100g", rate=2.0, requests=12,
             prompt_mean=512.0, output_mean=16.0, dilation=3.0, link="eth-100g", codec="none", seed=5)


def _launcher(tmp_path: Path, lines: list[str] | None = None, **fields) -> Launcher:
    log = lines.append if lines is not None else (lambda _msg: None)
    return Launcher(Scenario.build(**{**LIGHT, **fields}), report_path=tmp_path / "report.json", drain_timeout_s=20.0,
                    figures=False, accuracy_sample=0, log=log)


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ring")
    path = asyncio.run(_launcher(tmp).run())
    assert path is not None
    return json.loads(path.read_text())


def test_every_request_ring_or_not_completes_and_each_ring_layer_made_n_minus_1_hops(ring_run):
    scenario = Scenario.build(**LIGHT)
    assert ring_run["requests"]["ok"] + ring_run["requests"]["slo_miss"] == LIGHT["requests"]
    block = ring_run["ring"]
    ring_ids = [r["id"] for r in ring_run["per_request"] if RingSection.of(scenario).is_ring_request(scenario, r["id"])]
    assert block["requests"]["ring"] == len(ring_ids) >= 2 and block["requests"]["ring_failed"] == 0
    assert block["hops_per_layer"] == 1  # n − 1 for a ring of 2
    assert all(r["prompt_tokens"] == 4096 for r in ring_run["per_request"] if r["id"] in ring_ids)
    assert not block["failures"] and block["failed_prompts"] == 0


def test_the_ring_requests_attention_is_measured_beside_the_models(ring_run):
    block = ring_run["ring"]
    assert block["attention_s"]["measured"] == pytest.approx(block["attention_s"]["model"], rel=0.05)
    check = ring_run["fidelity"]["ring_prefill-0"]
    assert check["ok"], check
    assert check["measured"] == pytest.approx(block["ratio_median"] - 1)


def test_a_ring_requests_ttft_carries_its_ring_prefill(ring_run):
    """On one clock: a ring request's first token comes after its ring (the rest of the prompt + the attention), so
    its TTFT is at least its prefill's model time; the ordinary requests' are the short prompts'."""
    block, scenario = ring_run["ring"], Scenario.build(**LIGHT)
    ring = RingSection.of(scenario)
    ring_ttfts = [r["ttft_s"] for r in ring_run["per_request"] if ring.is_ring_request(scenario, r["id"])]
    assert min(ring_ttfts) >= 0.99 * block["model"]["prefill_s"]
    assert block["ttft_ms"]["other"]["p50"] < block["ttft_ms"]["ring"]["p50"]


@pytest.mark.shares_host  # failures, reasons and the ledger: what happened, not how fast
def test_a_ring_follower_that_dies_fails_the_ring_requests_with_the_rings_reason_and_nothing_else(tmp_path):
    lines: list[str] = []
    launcher = _launcher(tmp_path, lines, requests=16)
    scenario = launcher.scenario

    async def run_and_kill():
        run = asyncio.create_task(launcher.run())
        await until_stats(launcher, "prefill", lambda stats: stats["ring"]["measured_s"])  # a ring prompt ran
        follower = next(c for c in launcher.children if c.role == "ring-rank")
        os.kill(follower.started.pid, signal.SIGKILL)
        return await run

    asyncio.run(run_and_kill())
    assert launcher.group_losses == ["prefill-0-ring-1"]
    assert any("prefill-0-ring-1" in line and "killed by signal 9" in line for line in lines)
    report = json.loads((tmp_path / "report.json").read_text())
    failed = [r for r in report["per_request"] if r["outcome"] == "failed"]
    assert failed and all(RingSection.of(scenario).is_ring_request(scenario, r["id"]) for r in failed)
    reasons = report["requests"]["failed_reasons"]
    assert all("ring attention failed" in reason for reason in reasons), reasons
    others = [r for r in report["per_request"] if not RingSection.of(scenario).is_ring_request(scenario, r["id"])]
    assert others and all(r["outcome"] in ("ok", "slo-miss") for r in others)
    assert not report["faithful"] and "ring failed" in report["fidelity"]["ring_prefill-0"]["hint"]
    verdict = ledger_check.read(tmp_path / "report.run" / "ledger.jsonl")
    assert verdict.ok, verdict.summary()  # nothing lost, every failure with a reason
