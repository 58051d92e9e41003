"""Every dashboard query and every Prometheus rule reads only metrics that exist: declared in runtime/metrics.py,
listed in METRICS.md, or recorded by prometheus/rules/recording.yml (whose own queries obey the same rule)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from dashboards.queries import all_queries, dashboard_files, metric_names
from kvtransit.model.judge.fidelity import KERNEL_TOLERANCE, LINK_RATE_TOLERANCE, TIMER_TOLERANCE
from kvtransit.runtime.metrics import all_metric_factories

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "prometheus" / "rules"
METRICS_MD = ROOT / "METRICS.md"
# Series Prometheus makes itself for every target, not kvtransit's to declare.
PROMETHEUS_OWN = {"up"}
# What client_python exposes for each family type, beyond the family name (counters drop their _total).
SAMPLE_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                   "gauge": ("",), "summary": ("", "_count", "_sum", "_created")}


def _exposed_names() -> set[str]:
    registry = CollectorRegistry()
    for factory in all_metric_factories().values():
        factory(registry)
    return {family.name + suffix for family in registry.collect() for suffix in SAMPLE_SUFFIXES[family.type]}


def _family(name: str) -> str:
    return re.sub(r"_(bucket|count|sum|total|created)$", "", name)


def _rules(kind: str) -> list[dict]:
    return [rule for path in sorted(RULES_DIR.glob("*.yml"))
            for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"] if kind in rule]


def _recorded() -> dict[str, str]:
    return {rule["record"]: rule["expr"] for rule in _rules("record")}


def _problems(where: str, expr: str, exposed: set[str], documented: set[str], recorded: dict[str, str]) -> list[str]:
    problems = []
    for name in sorted(metric_names(expr)):
        if name in PROMETHEUS_OWN:
            continue
        if ":" in name:
            if name not in recorded:
                problems.append(f"{where}: {name} is no recording rule in prometheus/rules/")
            continue
        if name not in exposed:
            problems.append(f"{where}: {name} is not exposed by runtime/metrics.py")
        if name not in documented and _family(name) not in documented:
            problems.append(f"{where}: {name} is not listed in METRICS.md")
    return problems


@pytest.fixture(scope="module")
def documented() -> set[str]:
    assert METRICS_MD.is_file(), "METRICS.md is missing at the repository root (it lists every metric)"
    return set(re.findall(r"kvtransit_[a-z0-9_]+", METRICS_MD.read_text()))


def test_there_are_four_dashboards_with_queries():
    titles = {json.loads(p.read_text())["title"] for p in dashboard_files()}
    assert titles == {"kvtransit / SLO overview", "kvtransit / Link and module", "kvtransit / Agents",
                      "kvtransit / Fidelity"}
    assert len(all_queries()) >= 30


def test_every_dashboard_query_reads_only_declared_documented_or_recorded_metrics(documented):
    exposed, recorded = _exposed_names(), _recorded()
    problems = [p for q in all_queries() for p in _problems(str(q), q.expr, exposed, documented, recorded)]
    assert not problems, "\n".join(problems)


def test_every_rule_reads_only_declared_documented_or_recorded_metrics(documented):
    exposed, recorded = _exposed_names(), _recorded()
    rules = [(rule.get("record") or rule["alert"], rule["expr"]) for rule in _rules("expr")]
    problems = [p for name, expr in rules for p in _problems(f"rule {name}", expr, exposed, documented, recorded)]
    assert not problems, "\n".join(problems)


def test_a_query_naming_an_unknown_metric_is_caught(documented):
    """The check can fail: a made-up metric, an unrecorded rule name and an undocumented one are all named."""
    expr = 'sum(rate(kvtransit_made_up_total[30s])) / kvtransit:not_recorded:ratio'
    problems = _problems("planted", expr, _exposed_names(), documented, _recorded())
    assert any("kvtransit_made_up_total is not exposed" in p for p in problems)
    assert any("kvtransit_made_up_total is not listed in METRICS.md" in p for p in problems)
    assert any("kvtransit:not_recorded:ratio is no recording rule" in p for p in problems)


def test_metric_names_ignores_labels_ranges_strings_and_functions():
    expr = ('histogram_quantile(0.99, sum by (le, link) (rate(kvtransit_x_bucket{link="eth-25g", le!="+Inf"}[30s])))'
            ' > on (link) group_left kvtransit:y:ratio or up{job="kvtransit"} offset 5m')
    assert metric_names(expr) == {"kvtransit_x_bucket", "kvtransit:y:ratio", "up"}


def test_the_fidelity_alert_uses_the_fidelity_guards_tolerances():
    (alert,) = [r for r in _rules("alert") if r["alert"] == "KvtransitRunNotFaithful"]
    assert f"< (1 - {LINK_RATE_TOLERANCE:g})" in alert["expr"]
    assert f"> {float(KERNEL_TOLERANCE)!r}" in alert["expr"]
    assert f"(kvtransit_timer_lateness_step_share) > {TIMER_TOLERANCE:g}" in alert["expr"]  # lateness counts too


def test_every_panel_uses_the_provisioned_datasource_uid():
    provisioned = yaml.safe_load((ROOT / "dashboards/provisioning/datasources/prometheus.yml").read_text())
    (uid,) = [d["uid"] for d in provisioned["datasources"]]
    for path in dashboard_files():
        for panel in json.loads(path.read_text())["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == uid, f"{path.name}: {panel['title']}"


def test_the_committed_json_is_what_the_generator_writes():
    pytest.importorskip("grafana_foundation_sdk", reason="the `dashboards` extra is not installed")
    from dashboards import generate

    assert generate.main(["--check"]) == 0, "dashboards/json is stale: run python dashboards/generate.py"
