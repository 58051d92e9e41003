"""`kvtransit up --kv-placement remote`: a long-context class whose KV lives in the KV pool, fetched
each decode step through the middlebox over the decode link the hand-offs cross, on one clock.

Real processes on loopback: the pool makes each remote context (synthetic KV at the run's scale) and answers the
legs; the middlebox stamps every answer on the hand-off link's own bucket and, with top-k, scores the pages'
summaries (the module's MAC) before decode ranks them and fetches the chosen pages. The report's `remote_kv` block
and its fidelity check hold the legs against the model at the bytes they moved; a middlebox that dies mid-run fails
only the remote requests of the steps it was relaying, with the reason, and the run ends with every request
accounted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.judge import ledger_check
from kvtransit.model.scenario import Scenario
from tests.integration._launcher_stats import until_stats

pytestmark = pytest.mark.timeout(240)

# Light load, 8k-token contexts (a step's legs are tens of ms of link at eth-100g, so steps are long enough for the
# 2-core box), every other request remote.
LIGHT = dict(kv_pool="pool", kv_placement="remote", link="eth-100g", remote_context=8192, remote_share=0.5,
             rate=2.0, requests=12, prompt_mean=512.0, output_mean=16.0, codec="none")
# The noisy 2-core box's band for the legs' median against the model (the guard's own is 5 %).
LEGS_BAND = 0.10


def _run(tmp_path: Path, **fields) -> dict:
    launcher = Launcher(Scenario.build(**{**LIGHT, **fields}), figures=False, report_path=tmp_path / "report.json",
                        drain_timeout_s=20.0, accuracy_sample=0, links="loopback", log=lambda _msg: None)
    path = asyncio.run(launcher.run())
    assert path is not None
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def top_k(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("remote-top-k"))


@pytest.fixture(scope="module")
def every_token(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("remote-all"), select="all")


def test_every_request_completes_and_the_remote_class_fetched_its_context_every_step(top_k):
    assert top_k["requests"]["ok"] + top_k["requests"]["slo_miss"] == LIGHT["requests"]
    block = top_k["remote_kv"]
    assert block["select"] == "top-k" and block["budget"] == 1 / 16 and block["scoring"].startswith("fits")
    assert 0 < block["requests"]["remote"] < LIGHT["requests"]
    assert block["steps"] > 0 and not block["failures"] and block["made_on_demand"] == 0
    # The module scored every summary that crossed (model bytes, as the decode counted them arriving).
    assert block["scored_bytes"] == pytest.approx(block["summary_bytes"]["measured"] * _request_steps(top_k))


def _request_steps(report: dict) -> int:
    decode = next(a for a in report["run"]["agents"] if a.get("role") == "decode")
    return decode["remote_kv"]["request_steps"]


def test_top_k_moves_the_models_bytes_a_step_and_sixteen_times_fewer_than_every_token(top_k, every_token):
    chosen, every = top_k["remote_kv"], every_token["remote_kv"]
    # Exactly the model's bytes per request-step (flows/selection/model.py), at the run's scale multiplied back.
    assert chosen["summary_bytes"]["measured"] == pytest.approx(chosen["summary_bytes"]["model"], rel=1e-9)
    assert chosen["page_bytes"]["measured"] == pytest.approx(chosen["page_bytes"]["model"], rel=1e-9)
    assert every["summary_bytes"]["measured"] == 0
    assert every["page_bytes"]["measured"] == pytest.approx(every["page_bytes"]["model"], rel=1e-9)
    moved = chosen["summary_bytes"]["measured"] + chosen["page_bytes"]["measured"]
    assert every["page_bytes"]["measured"] / moved == pytest.approx(chosen["reduction_vs_all"], rel=1e-9)
    assert chosen["reduction_vs_all"] > 10  # 1/16 of the pages plus the summaries (1/128 of the KV)


def test_the_legs_are_measured_beside_the_model_and_cost_the_remote_class_its_tpot(top_k, every_token):
    for report in (top_k, every_token):
        block = report["remote_kv"]
        assert block["idle_link_steps"] > 0
        assert block["legs_ratio_median"] == pytest.approx(1.0, abs=LEGS_BAND)
        check = next(v for k, v in report["fidelity"].items() if k.startswith("remote_kv_"))
        assert check["measured"] == pytest.approx(block["legs_ratio_median"] - 1)
    # Every token of an 8k context is ~1 GB a step at eth-100g (~86 ms): far longer than the top pages' legs.
    assert every_token["remote_kv"]["legs_s"]["model"] > 5 * top_k["remote_kv"]["legs_s"]["model"]
    assert (every_token["remote_kv"]["tpot_ms"]["remote"]["p50"]
            > 3 * top_k["remote_kv"]["tpot_ms"]["remote"]["p50"])


@pytest.mark.shares_host  # failures, reasons and the ledger: what happened, not how fast
def test_a_middlebox_that_dies_fails_only_the_remote_steps_it_was_relaying_and_loses_nothing(tmp_path):
    lines: list[str] = []
    scenario = Scenario.build(**{**LIGHT, "requests": 16, "output_mean": 64.0})
    launcher = Launcher(scenario, report_path=tmp_path / "report.json", drain_timeout_s=10.0, accuracy_sample=0,
                        figures=False, restart_roles=("middlebox",), links="loopback", log=lines.append)

    async def run_and_kill():
        run = asyncio.create_task(launcher.run())
        await until_stats(launcher, "decode", lambda stats: stats.get("remote_kv", {}).get("steps", 0) >= 3)
        os.kill(launcher.current("middlebox").started.pid, signal.SIGKILL)
        return await run

    asyncio.run(run_and_kill())
    report = json.loads((tmp_path / "report.json").read_text())
    requests = report["requests"]
    assert requests["ok"] + requests["slo_miss"] + requests["failed"] == 16
    assert any(r["name"] == "middlebox-0" for r in launcher.restarts)  # the supervisor restarted it
    # A step whose legs the kill cut fails its remote requests, naming the remote KV (a step that waited for the
    # restarted middlebox's connection instead goes on); the prefills resend their hand-offs, so none fails.
    for reason in requests["failed_reasons"]:
        assert reason.startswith("remote KV: "), reason
    # After the restart the new middlebox dialled decode again and later steps fetched their context.
    decode = next(a for a in report["run"]["agents"] if a.get("role") == "decode")
    assert decode["remote_kv"]["steps"] > 3
    verdict = ledger_check.read(tmp_path / "report.run" / "ledger.jsonl")
    assert verdict.ok, verdict.summary()
