"""metrics.py is the one place metrics are declared; METRICS.md documents exactly what it declares."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kvtransit.runtime import metrics

METRICS_MD = Path(__file__).resolve().parents[2] / "METRICS.md"
ROW = re.compile(r"^\|\s*`(kvtransit_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|\s*([^|]*)\|")


def declared() -> dict[str, tuple[str, frozenset[str]]]:
    """name as exposed (counters with _total) -> (type, label names), from every role's factory."""
    found = {}
    for factory in metrics.all_metric_factories().values():
        registry = CollectorRegistry()
        for metric in vars(factory(registry)).values():
            kind = metric._type
            name = metric._name + ("_total" if kind == "counter" else "")
            found[name] = (kind, frozenset(metric._labelnames))
    return found


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    rows = {}
    for line in METRICS_MD.read_text().splitlines():
        m = ROW.match(line)
        if m:
            labels = frozenset(re.findall(r"`(\w+)`", m.group(3)))
            rows[m.group(1)] = (m.group(2), labels)
    return rows


def test_metrics_md_documents_every_declared_metric_and_nothing_else():
    code, doc = declared(), documented()
    assert sorted(set(code) - set(doc)) == [], "declared in metrics.py but missing from METRICS.md"
    assert sorted(set(doc) - set(code)) == [], "in METRICS.md but not declared in metrics.py"
    mismatched = {name: (code[name], doc[name]) for name in code if code[name] != doc[name]}
    assert not mismatched, f"type or labels differ (code, METRICS.md): {mismatched}"


def test_every_metric_follows_the_naming_rules():
    for name, (kind, labels) in declared().items():
        assert name.startswith("kvtransit_")
        assert labels <= metrics.ALLOWED_LABELS, f"{name}: unbounded label {sorted(labels - metrics.ALLOWED_LABELS)}"
        assert (kind == "counter") == name.endswith("_total"), name
        if kind == "histogram":  # a distribution of a quantity: its unit is in the name (gauges may be counts)
            assert re.search(r"_(seconds|bytes|joules)$", name), f"{name}: no base unit"


@pytest.mark.parametrize("buckets,threshold", [(metrics.TTFT_BUCKETS_S, 1.0), (metrics.TPOT_BUCKETS_S, 0.025)])
def test_latency_buckets_contain_the_slo_thresholds_exactly(buckets, threshold):
    assert threshold in buckets
    assert list(buckets) == sorted(buckets)


def test_each_registry_gets_its_own_metrics():
    first, second = CollectorRegistry(), CollectorRegistry()
    a, b = metrics.middlebox_metrics(first), metrics.middlebox_metrics(second)
    a.kv_in_bytes.labels(link="eth-25g", codec="none").inc(100)
    assert first.get_sample_value("kvtransit_middlebox_kv_in_bytes_total",
                                  {"link": "eth-25g", "codec": "none"}) == 100
    assert second.get_sample_value("kvtransit_middlebox_kv_in_bytes_total",
                                   {"link": "eth-25g", "codec": "none"}) is None
    b.requests.labels(outcome="ok").inc()
    assert second.get_sample_value("kvtransit_middlebox_requests_total", {"outcome": "ok"}) == 1
