"""The renderers' entry points: read what a render needs from disk, build the manifests, write the directory.

- `write_testbed`: `kvtransit k8s render` (a kustomize base: the testbed, its monitoring, the dashboards).
- `write_chaos`: `kvtransit chaos --render k8s` (a testbed for the chaos scenario, and one experiment per local
  chaos scenario under experiments/, with an index).
- `write_sweep`: `kvtransit sweep --render k8s` (the points ConfigMap and the Indexed Job).
"""

from __future__ import annotations

from pathlib import Path

from kvtransit.harness.deploy.k8s.bundle import HEADER, file_texts, write_files
from kvtransit.harness.deploy.k8s.chaos_mesh import ChaosTarget, describe, experiments
from kvtransit.harness.deploy.k8s.monitoring import (
    DASHBOARDS_DIR,
    DEFAULT_PROMETHEUS_URL,
    dashboard_configmaps,
    datasource_configmap,
    service_monitor,
)
from kvtransit.harness.deploy.k8s.naming import Names
from kvtransit.harness.deploy.k8s.sweep_job import SweepJobOptions, sweep_job
from kvtransit.harness.deploy.k8s.testbed import TestbedOptions, render_testbed, runs_reader
from kvtransit.harness.deploy.k8s.yaml_text import dump_all
from kvtransit.harness.studies.chaos import SCENARIOS
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

RUNS_READER_FILE = "runs-reader.yaml"


def read_dashboards(directory: Path) -> dict[str, str]:
    directory = Path(directory)
    found = {path.name: path.read_text(encoding="utf-8") for path in sorted(directory.glob("*.json"))}
    if not found:
        raise ConfigError(f"--dashboards {directory}: no dashboard JSON there (dashboards/json/ of the repository, "
                          "written by dashboards/generate.py)")
    return found


def base_texts(scenario: Scenario, options: TestbedOptions, *, dashboards: dict[str, str],
               prometheus_url: str = DEFAULT_PROMETHEUS_URL, command: str = "kvtransit k8s render") -> dict[str, str]:
    """File name → text of the testbed's kustomize base (and the runs reader beside it)."""
    parts = render_testbed(scenario, options)
    names = Names(options.name)
    parts["monitoring.yaml"] = [service_monitor(names), datasource_configmap(names, prometheus_url),
                                *dashboard_configmaps(names, dashboards)]
    return file_texts(parts, command=command, namespace=options.namespace,
                      extra={RUNS_READER_FILE: [runs_reader(options)]})


def write_testbed(out: Path, scenario: Scenario, options: TestbedOptions, *, force: bool,
                  dashboards_dir: Path = DASHBOARDS_DIR, prometheus_url: str = DEFAULT_PROMETHEUS_URL) -> list[Path]:
    texts = base_texts(scenario, options, dashboards=read_dashboards(dashboards_dir), prometheus_url=prometheus_url)
    return write_files(out, texts, force=force)


def chaos_texts(scenario: Scenario, options: TestbedOptions, *, dashboards: dict[str, str],
                prometheus_url: str = DEFAULT_PROMETHEUS_URL) -> dict[str, str]:
    """testbed/ (the chaos scenario's testbed, user-space shaped: see chaos_mesh.py) and experiments/NAME.yaml."""
    command = "kvtransit chaos --render k8s"
    texts = {f"testbed/{name}": text for name, text in base_texts(
        scenario, options, dashboards=dashboards, prometheus_url=prometheus_url, command=command).items()}
    target = ChaosTarget(Names(options.name), options.namespace, options.image)
    built = experiments(scenario, target)
    header = HEADER.format(command=command)
    for name, manifest in built.items():
        texts[f"experiments/{name}.yaml"] = header + dump_all([manifest])
    rows = [f"| {name} | {describe(manifest)} | {SCENARIOS[name].description} |"
            for name, manifest in built.items()]
    texts["experiments/INDEX.md"] = "\n".join([
        "# Chaos experiments (one per `kvtransit chaos` scenario, same names)", "",
        ("Apply the testbed (`kubectl apply -k testbed/`), wait for the load generator's pod to be Ready, then "
         "apply one experiment (`kubectl apply -f experiments/NAME.yaml`). When the load generator's Job is done, copy "
         "the ledger out (testbed/runs-reader.yaml) and judge the run: `kvtransit chaos --check-ledger ledger.jsonl`."),
        "",
        "| scenario | on the cluster | the local fault |", "| --- | --- | --- |", *rows, ""])
    return texts


def write_chaos(out: Path, scenario: Scenario, options: TestbedOptions, *, force: bool,
                dashboards_dir: Path = DASHBOARDS_DIR, prometheus_url: str = DEFAULT_PROMETHEUS_URL) -> list[Path]:
    texts = chaos_texts(scenario, options, dashboards=read_dashboards(dashboards_dir), prometheus_url=prometheus_url)
    return write_files(out, texts, force=force)


def sweep_texts(points: list[tuple[str, Scenario]], options: SweepJobOptions, namespace: str) -> dict[str, str]:
    return file_texts(sweep_job(points, options), command="kvtransit sweep --render k8s", namespace=namespace)


def write_sweep(out: Path, points: list[tuple[str, Scenario]], options: SweepJobOptions, namespace: str, *,
                force: bool) -> list[Path]:
    return write_files(out, sweep_texts(points, options, namespace), force=force)
