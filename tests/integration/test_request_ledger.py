"""Every `kvtransit up`-style run leaves a request ledger that agrees with the report and with the load
generator's Prometheus requests counter (the `counters` record is read from the registry /metrics serves).

Any run shows it, so this reads the session's light loopback run (tests/integration/conftest.py, which
test_serving_loop.py judges against the model) instead of starting one of its own."""

from __future__ import annotations

import pytest

from kvtransit.model.judge import ledger_check as ledger

pytestmark = pytest.mark.timeout(120)


def test_the_ledger_of_a_run_reconciles_with_the_report_and_the_prometheus_counter(light_loopback_run):
    scenario, report = light_loopback_run.scenario, light_loopback_run.report
    path = light_loopback_run.run_dir / ledger.LEDGER_FILE
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
