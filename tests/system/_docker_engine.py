"""A private Docker engine and the testbed's offline images, for the system tests that run containers
(test_compose_testbed.py, test_swarm_stack.py).

The engine is docker/engine.sh's: its own socket, data root and pid file, stopped by its pid, and what it did to
the host (nftables tables, the docker0 and docker_gwbridge bridges, ip_forward) undone. The images are built as CI
builds them with no registry: the debootstrap base (docker/build-base.sh), the host wheelhouse and Prometheus
binary, then `docker-compose build` of the offline path (docker-compose.offline.yml over docker-compose.yml). About
1.5 minutes cold on a 2-core box (benchmarks/RESULTS.md, "Docker on this machine").
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
NEEDED = ("dockerd", "docker", "docker-compose", "debootstrap", "apt-get", "dpkg-deb", "nft", "tc")
# docker-compose.offline.yml over the default file: Dockerfile.offline, docker/prometheus.Dockerfile, Grafana opt-in.
OFFLINE_COMPOSE_FILE = "docker-compose.yml:docker-compose.offline.yml"
STEP_TIMEOUT_S = 180.0  # one build step or the run itself, cold (measured: debootstrap about 40 s)
# The testbed's agents, as compose and the stack name their services.
AGENTS = ("prefill", "middlebox", "decode", "loadgen")
# A few seconds of load at a rate the box carries; the scale is auto (the link shaped to the host budget).
SCENARIO = ["--requests", "12", "--rate", "4", "--prompt-mean", "512", "--output-mean", "32", "--seed", "3"]

# The marks every test on a private engine carries: it needs root and the tools, else it skips saying which.
REQUIRES_ENGINE = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the Docker engine needs root"),
    pytest.mark.skipif(any(shutil.which(tool) is None for tool in NEEDED),
                       reason="needs " + ", ".join(NEEDED) + " (apt-get install docker.io docker-compose debootstrap "
                              "iproute2 nftables)"),
]


def run(argv: list[str], env: dict, timeout: float = STEP_TIMEOUT_S) -> str:
    """`argv` from the repository's root; its stdout, or an assertion quoting both streams' tails."""
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                                  f"{done.stderr[-3000:]}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def offline_env(run_id: str) -> dict[str, str]:
    """The variables of one test's offline build: its own image tags, the offline compose files, no profiles."""
    return {
        # The offline path: no registry here, so no image is pulled and no package index is asked.
        "COMPOSE_FILE": OFFLINE_COMPOSE_FILE,
        "COMPOSE_PROFILES": "",  # the default services only, whatever the caller's shell says
        "KVTRANSIT_OFFLINE_BASE_IMAGE": f"kvtransit-base:test-{run_id}",
        "KVTRANSIT_IMAGE_TAG": f"test-{run_id}",
    }


def offline_images(env: dict) -> list[str]:
    """The images build_offline_images makes, by exact name (docker-compose.offline.yml's, at this tag)."""
    tag = env["KVTRANSIT_IMAGE_TAG"]
    return [f"kvtransit:{tag}", f"kvtransit-prometheus:{tag}", env["KVTRANSIT_OFFLINE_BASE_IMAGE"]]


@contextmanager
def private_engine(env: dict) -> Iterator[dict]:
    """A private engine for the block: yields `env` with DOCKER_HOST pointing at it; stops it (by its pid) and
    removes its state after the block, whatever happened in it."""
    # Short: dockerd puts unix sockets under its exec root (108-byte path limit).
    state = Path(tempfile.mkdtemp(prefix="kvtd-", dir="/tmp"))
    state.rmdir()  # engine.sh start creates it, and refuses a dir already holding an engine
    env = {**env, "DOCKER_HOST": f"unix://{state}/docker.sock"}
    try:
        run([str(DOCKER / "engine.sh"), "start", str(state)], env)
        yield env
    finally:
        if state.exists():
            subprocess.run([str(DOCKER / "engine.sh"), "stop", str(state)], capture_output=True, timeout=120)
    assert not state.exists(), "the engine's state dir was not removed"


def build_offline_images(env: dict) -> None:
    """The base (KVTRANSIT_OFFLINE_BASE_IMAGE), then the agents' and Prometheus's images (KVTRANSIT_IMAGE_TAG)."""
    run([str(DOCKER / "build-base.sh"), env["KVTRANSIT_OFFLINE_BASE_IMAGE"]], env)
    run([str(DOCKER / "build-wheelhouse.sh")], env)
    run([str(DOCKER / "fetch-prometheus.sh")], env)
    run(["docker-compose", "build", "-q"], {**env, "COMPOSE_FILE": OFFLINE_COMPOSE_FILE})


def agents_scraped(prometheus_url: str, agents: tuple[str, ...], *, timeout_s: float = 30.0) -> dict[str, float | None]:
    """Each agent's best `up` over the run as the testbed's Prometheus recorded it (the load generator may have
    exited, so over the last 10 minutes), polled until every agent reads 1 or `timeout_s` passed."""
    query = urllib.parse.urlencode({"query": 'max by (agent) (max_over_time(up{job="kvtransit"}[10m]))'})
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"{prometheus_url}/api/v1/query?{query}", timeout=5) as response:
            result = json.load(response)["data"]["result"]
        scraped = {series["metric"]["agent"]: float(series["value"][1]) for series in result}
        if all(scraped.get(agent) == 1.0 for agent in agents) or time.monotonic() > deadline:
            return {agent: scraped.get(agent) for agent in agents}
        time.sleep(1)
