"""A real Prometheus for one run (`kvtransit up --prometheus`): config in the run dir, start, wait, stop.

    with start_prometheus(run_dir, [ScrapeTarget("prefill", "10.77.1.1:9100"), ...]) as prom:
        print(prom.announcement())        # one line with its URL, for people and for tests
        ...                               # the run
    # stopped by its pid, its storage dir removed

The configuration is the repository's own `prometheus/` (prometheus.yml and rules/, the same files the
compose Prometheus mounts): it is copied into `RUN_DIR/prometheus/`, and this run's targets are written beside
it as `targets/run.json` (file-based discovery), so one config file serves both ways to bring the testbed up.
Prometheus listens on 127.0.0.1 on a free port and keeps its TSDB in a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvtransit.model.errors import ConfigError
from kvtransit.paths import REPO

INSTALL_HINT = "apt-get install prometheus"
# Where the repository keeps the config and rules; an installed (non-editable) kvtransit has no checkout, so
# KVTRANSIT_PROMETHEUS_DIR can point at a copy of that directory.
CONFIG_DIR_ENV = "KVTRANSIT_PROMETHEUS_DIR"
REPO_CONFIG_DIR = REPO / "prometheus"
# Prometheus opens its TSDB and loads rules in well under a second here; a cold, loaded CI box gets 30 s.
READY_TIMEOUT_S = 30.0
# SIGTERM makes Prometheus flush and exit (about 0.1 s here); past this it is killed.
STOP_TIMEOUT_S = 10.0
ANNOUNCE_PREFIX = "KVTRANSIT-PROMETHEUS"


class PrometheusUnavailable(ConfigError):
    """`--prometheus` was asked for and cannot be had: no binary, no config, or it would not start."""


@dataclass(frozen=True)
class ScrapeTarget:
    """One process to scrape: its agent role (the `agent` target label) and its /metrics HOST:PORT."""

    agent: str
    address: str

    def __post_init__(self) -> None:
        host, sep, port = self.address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"scrape target {self.agent}: expected HOST:PORT, got {self.address!r}")


def find_prometheus() -> str:
    """The `prometheus` binary on PATH, or a one-line error with the install hint."""
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusUnavailable(f"--prometheus: no `prometheus` binary on PATH (install it: {INSTALL_HINT})")
    return found


def config_source_dir() -> Path:
    """The directory holding prometheus.yml and rules/ (KVTRANSIT_PROMETHEUS_DIR, else the checkout's)."""
    source = Path(os.environ.get(CONFIG_DIR_ENV) or REPO_CONFIG_DIR)
    if not (source / "prometheus.yml").is_file() or not (source / "rules").is_dir():
        raise PrometheusUnavailable(
            f"--prometheus: no prometheus.yml and rules/ in {source} (set {CONFIG_DIR_ENV} to the repository's "
            f"prometheus/ directory)")
    return source


def targets_document(targets: Sequence[ScrapeTarget], run_id: str | None = None) -> list[dict]:
    """Prometheus file_sd JSON: one group per agent role, labelled `agent` (and `run` when given)."""
    groups: dict[str, list[str]] = {}
    for target in targets:
        groups.setdefault(target.agent, []).append(target.address)
    document = []
    for agent, addresses in groups.items():
        labels = {"agent": agent}
        if run_id:
            labels["run"] = run_id
        document.append({"targets": addresses, "labels": labels})
    return document


def write_config(run_dir: str | Path, targets: Sequence[ScrapeTarget], run_id: str | None = None) -> Path:
    """Copy prometheus.yml and rules/ into RUN_DIR/prometheus/ and write this run's targets; return the config."""
    if not targets:
        raise ConfigError("--prometheus: no scrape targets given")
    source = config_source_dir()
    out = Path(run_dir) / "prometheus"
    (out / "targets").mkdir(parents=True, exist_ok=True)
    shutil.copy2(source / "prometheus.yml", out / "prometheus.yml")
    shutil.copytree(source / "rules", out / "rules", dirs_exist_ok=True)
    (out / "targets" / "run.json").write_text(json.dumps(targets_document(targets, run_id), indent=2) + "\n")
    return out / "prometheus.yml"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (bind to 0). Another process could take it before Prometheus
    binds; then Prometheus exits at once and start_prometheus reports its log."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@dataclass
class PrometheusProcess:
    """A running Prometheus that this process started; `stop()` ends it by its pid and removes its TSDB."""

    process: subprocess.Popen
    url: str
    config_path: Path
    storage_dir: Path
    log_path: Path
    targets: tuple[ScrapeTarget, ...] = field(default_factory=tuple)

    @property
    def pid(self) -> int:
        return self.process.pid

    def announcement(self) -> str:
        """The one line `kvtransit up` prints: a fixed prefix and JSON, easy to read for people and tests."""
        return f"{ANNOUNCE_PREFIX} " + json.dumps(
            {"url": self.url, "pid": self.pid, "config": str(self.config_path), "targets": len(self.targets)})

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.storage_dir, ignore_errors=True)

    def __enter__(self) -> PrometheusProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _ready(url: str) -> bool:
    try:
        # The only caller passes the http://127.0.0.1 URL start_prometheus built: no file: or custom scheme.
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1.0) as response:  # noqa: S310
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_prometheus(run_dir: str | Path, targets: Sequence[ScrapeTarget], *, run_id: str | None = None,
                     binary: str | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> PrometheusProcess:
    """Write the run's config, start Prometheus on 127.0.0.1:<free port>, and return once it is ready."""
    binary = binary or find_prometheus()
    config_path = write_config(run_dir, targets, run_id)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    storage_dir = Path(tempfile.mkdtemp(prefix="kvtransit-prometheus-"))
    log_path = config_path.parent / "prometheus.log"
    argv = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={storage_dir}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    handle = PrometheusProcess(process, url, config_path, storage_dir, log_path, tuple(targets))
    deadline = time.monotonic() + ready_timeout_s
    while not _ready(url):
        if process.poll() is not None or time.monotonic() > deadline:
            why = (f"exited with status {process.returncode}" if process.poll() is not None
                   else f"not ready after {ready_timeout_s:g} s")
            handle.stop()
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise PrometheusUnavailable(f"--prometheus: {binary} {why}; its log ({log_path}): " + " | ".join(tail))
        time.sleep(0.05)
    return handle
