"""Every `kvtransit up`-style run leaves a request ledger that agrees with the report and with the load
generator's Prometheus requests counter (the `counters` record is read from the registry /metrics serves)."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.judge import ledger_check as ledger
from kvtransit.model.scenario import Scenario

pytestmark = pytest.mark.timeout(120)


def test_the_ledger_of_a_run_reconciles_with_the_report_and_the_prometheus_counter(tmp_path):
    scenario = Scenario(codec="none", rate=4.0, requests=12, prompt_mean=512.0, output_mean=8.0)
    launcher = Launcher(scenario, report_path=tmp_path / "run.json", drain_timeout_s=20.0, log=lambda _line: None)
    report = json.loads(asyncio.run(launcher.run()).read_text())
    path = tmp_path / "run.run" / ledger.LEDGER_FILE
    records = ledger.parse(path.read_text().splitlines(keepends=True))
    verdict = ledger.check(records)
    assert verdict.ok, verdict.problems()
    counters = next(r["requests"] for r in records if r["ev"] == "counters")
    requests = report["requests"]
    assert counters == {"ok": requests["ok"], "slo-miss": requests["slo_miss"], "failed": requests["failed"],
                        "timed-out": requests["timed_out"]}
    assert sum(counters.values()) == verdict.requests == scenario.requests
    assert {r["id"] for r in records if r["ev"] == "sent"} == set(range(scenario.requests))
    assert report["ledger"]["lost"] == 0 and report["ledger"]["requests"] == scenario.requests
