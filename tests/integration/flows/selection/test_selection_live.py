"""Query-aware selection over real processes and a shaped link: a pool, the module that scores the
pages' summaries in transit, and decode that ranks and fetches only the chosen pages; every token is the baseline;
Quest's bound is scored at the host; what arrived is judged as the offline measure judges it; a pool that dies
fails the run for every role with a reason."""

from __future__ import annotations

import json

import pytest

from kvtransit.cli import main
from kvtransit.cli.accuracy import default_sample_path
from kvtransit.flows.selection.run import offline_selection, plan_selection, run_selection
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.module.budget import Policy

SAMPLE = str(default_sample_path())
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # every test runs three processes


def _plan(**kw):
    kw.setdefault("steps", 5)
    return plan_selection(MODELS["llama3-8b"], DEVICES["h100"], LINKS["eth-100g"], context=32768, sample=SAMPLE, **kw)


async def test_top_k_fetches_the_chosen_pages_and_its_step_lands_on_the_model():
    plan = _plan(budget=1 / 16)
    report = await run_selection(plan)
    report.offline = offline_selection(plan)
    s = report.summary()
    assert report.ok, report.failures
    assert s["chosen_pages"] == 2  # ⌈22-24 pages / 16⌉
    assert s["measured_summary_bytes"] > 0 and s["module"]["scores"] > 0  # the module scored them
    # What arrived is what the offline measure selects on the same queries (float16: the sample's own values).
    assert s["accuracy"]["recall"] == pytest.approx(s["offline"]["recall"], rel=1e-9)
    assert s["accuracy"]["output_error"] == pytest.approx(s["offline"]["output_error"], rel=1e-9)
    assert abs(s["step_error"]) < 0.15  # a noisy shared 2-core box; RESULTS.md holds the measured figure
    assert s["faithful"] == (abs(s["step_error"]) <= 0.05)  # the verdict is its own measurement's


async def test_quests_bound_is_scored_at_the_host_and_picks_what_the_offline_measure_picks():
    plan = _plan(budget=1 / 4, kind="minmax", policy=Policy.HOST, sink_pages=1)
    report = await run_selection(plan)
    report.offline = offline_selection(plan)
    s = report.summary()
    assert report.ok, report.failures
    assert s["scoring"] == "host" and s["module"]["scores"] == 0  # the module only relayed the summaries
    assert s["accuracy"]["recall"] == pytest.approx(s["offline"]["recall"], rel=1e-9)


def test_every_token_is_the_baseline_and_selection_shortens_the_step(capsys):
    assert main(["select", "--budget", "1/16", "--steps", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    top, everything = out["runs"]
    assert (top["select"], everything["select"]) == ("top-k", "all")
    assert everything["accuracy"] == {"recall": 1.0, "output_error": 0.0}
    effect = out["tpot_effect"]
    assert effect["measured_byte_ratio"] > 5 and effect["measured_step_ratio"] > 3
    assert effect["measured_step_ratio"] == pytest.approx(
        everything["model_step_at_measured_bytes_s"] / top["model_step_at_measured_bytes_s"], rel=0.15)


async def test_a_pool_that_dies_fails_the_run_for_every_role_with_a_reason():
    plan = _plan(budget=None, steps=40)
    report = await run_selection(plan, kill_role="pool", kill_after_s=0.5, timeout_s=plan.deadline_s * 3 + 20)
    assert not report.ok and report.summary()["faithful"] is False  # a failed run is never faithful
    assert any(f.startswith("pool was killed by signal 9 without a result") for f in report.failures)
    for role in ("scorer", "decode"):
        result = report.results[role]
        assert not result["ok"] and "pool" in result["reason"] and "step" in result["reason"]
