"""Compose's Prometheus scrapes the KV pool while the `kvpool` profile is on: prometheus/prometheus.yml finds the
service by its name (DNS), on the port its /metrics listens on in docker-compose.yml, and labels it as the
file-listed agents are labelled (job="kvtransit", agent="kvpool"), so the dashboards and rules see it."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[4]


def _scrape_jobs() -> dict[str, dict]:
    config = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def _compose_services() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def _flag(command: str, name: str) -> str:
    words = shlex.split(command)
    return words[words.index(name) + 1]


def test_the_pool_is_found_by_its_compose_service_name_on_its_metrics_port():
    (lookup,) = _scrape_jobs()["kvtransit-kvpool"]["dns_sd_configs"]
    services = _compose_services()
    assert services["kvpool"]["profiles"] == ["kvpool"]
    assert lookup["names"] == ["kvpool"] and lookup["type"] == "A"
    metrics_listen = _flag(services["kvpool"]["command"], "--metrics-listen")
    assert metrics_listen.rsplit(":", 1)[1] == str(lookup["port"])


def test_the_pool_shares_a_network_with_prometheus():
    services = _compose_services()
    # The agents' networks come from the x-agent anchor, which yaml has already merged in.
    assert set(services["kvpool"]["networks"]) & set(services["prometheus"]["networks"])


def test_the_pools_series_carry_the_same_job_and_an_agent_label_as_the_other_agents():
    jobs = _scrape_jobs()
    relabelled = {rule["target_label"]: rule["replacement"] for rule in jobs["kvtransit-kvpool"]["relabel_configs"]}
    assert relabelled == {"job": "kvtransit", "agent": "kvpool"}
    assert "kvtransit" in jobs  # the job whose name the pool's series take: the file-listed agents'
