"""`kvtransit up --prometheus`'s launcher: a real Prometheus scrapes a real /metrics endpoint, then stops by pid."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from kvtransit.harness.up import prometheus as launcher
from kvtransit.runtime.metrics import middlebox_metrics

pytestmark = pytest.mark.system
needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None,
                                      reason="prometheus not on PATH (apt-get install prometheus)")

# Scrapes every 1 s (prometheus/prometheus.yml); a loaded 2-core box gets ten times that.
SCRAPE_WAIT_S = 15.0


def _query(url: str, expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _wait_for(url: str, expr: str) -> list[dict]:
    deadline = time.monotonic() + SCRAPE_WAIT_S
    while time.monotonic() < deadline:
        result = _query(url, expr)
        if result:
            return result
        time.sleep(0.2)
    pytest.fail(f"{expr!r} returned no data within {SCRAPE_WAIT_S:g} s")


@pytest.fixture
def metrics_endpoint():
    """A real /metrics endpoint serving the middlebox's metrics from a fresh registry."""
    registry = CollectorRegistry()
    metrics = middlebox_metrics(registry)
    metrics.kv_in_bytes.labels(link="eth-25g", codec="freq-keep-k").inc(4096)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@needs_prometheus
def test_prometheus_scrapes_the_run_targets_and_stops_by_pid(tmp_path, metrics_endpoint):
    targets = [launcher.ScrapeTarget("middlebox", metrics_endpoint)]
    prom = launcher.start_prometheus(tmp_path, targets, run_id="kvt123456-")
    try:
        assert prom.url.startswith("http://127.0.0.1:")
        line = prom.announcement()
        assert line.startswith(launcher.ANNOUNCE_PREFIX + " ")
        assert json.loads(line.split(" ", 1)[1])["url"] == prom.url
        up = _wait_for(prom.url, 'up{job="kvtransit", agent="middlebox"} == 1')
        assert up[0]["metric"]["run"] == "kvt123456-"
        sample = _wait_for(prom.url, "kvtransit_middlebox_kv_in_bytes_total")
        assert float(sample[0]["value"][1]) == 4096
        # The rules were loaded from the run dir's copy.
        with urllib.request.urlopen(f"{prom.url}/api/v1/rules", timeout=5) as r:
            groups = json.load(r)["data"]["groups"]
        assert {g["name"] for g in groups} >= {"kvtransit-slo", "kvtransit-alerts"}
    finally:
        prom.stop()
    assert prom.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(prom.pid, 0)
    assert not prom.storage_dir.exists()
    assert (tmp_path / "prometheus" / "prometheus.yml").is_file()
    assert json.loads((tmp_path / "prometheus" / "targets" / "run.json").read_text()) == [
        {"targets": [metrics_endpoint], "labels": {"agent": "middlebox", "run": "kvt123456-"}}]


def test_a_missing_binary_is_one_clear_line_with_the_install_hint(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(launcher.PrometheusUnavailable, match="apt-get install prometheus"):
        launcher.find_prometheus()


@needs_prometheus
def test_a_prometheus_that_cannot_start_is_reported_with_its_log(tmp_path, metrics_endpoint):
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "prometheus"
    fake.write_text("#!/bin/sh\necho 'listen tcp: address already in use' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(launcher.PrometheusUnavailable, match=r"exited with status 1.*address already in use"):
        launcher.start_prometheus(tmp_path / "run", [launcher.ScrapeTarget("middlebox", metrics_endpoint)],
                                  binary=str(fake), ready_timeout_s=5)


def test_a_target_without_a_port_is_refused():
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        launcher.ScrapeTarget("decode", "10.0.0.1")
