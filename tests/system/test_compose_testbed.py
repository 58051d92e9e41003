"""`docker-compose up` for real, the OFFLINE path: a private Docker engine, the debootstrap base, the images from
the host wheelhouse and Prometheus binary (docker-compose.offline.yml over docker-compose.yml, selected by
COMPOSE_FILE), a short shaped run.

Checks that the run completed (the loadgen's report), that tc shaped the KV link inside the middlebox's
container (`tc -s qdisc`: a tbf that carried bytes), and that the compose Prometheus scraped every agent.
Then everything is torn down in a `finally`: the compose project (containers, networks, images), the engine
by its pid, the nftables tables and docker0 bridge it created, ip_forward as it was, and its data root
(docker/engine.sh). About 1.5 minutes cold on a 2-core box (shared/notes/docker-on-this-machine.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
AGENTS = ("prefill", "middlebox", "decode", "loadgen")
NEEDED = ("dockerd", "docker", "docker-compose", "debootstrap", "apt-get", "dpkg-deb", "nft", "tc")
# A few seconds of load at a rate the box carries; the scale is auto (the link shaped to the host budget).
SCENARIO = ["--requests", "12", "--rate", "4", "--prompt-mean", "512", "--output-mean", "32", "--seed", "3"]
# docker-compose.offline.yml over the default file: Dockerfile.offline, docker/prometheus.Dockerfile, Grafana opt-in.
OFFLINE_COMPOSE_FILE = "docker-compose.yml:docker-compose.offline.yml"
STEP_TIMEOUT_S = 180.0  # one build step or the run itself, cold (measured: debootstrap about 40 s)

pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.geteuid() != 0, reason="the Docker engine needs root"),
    pytest.mark.skipif(any(shutil.which(tool) is None for tool in NEEDED),
                       reason="needs " + ", ".join(NEEDED) + " (apt-get install docker.io docker-compose debootstrap "
                              "iproute2 nftables)"),
]


def _run(argv: list[str], env: dict, timeout: float = STEP_TIMEOUT_S) -> str:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                                  f"{done.stderr[-3000:]}")
    return done.stdout


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _unready_container_logs(env: dict) -> str:
    """Every container of the compose project that is not running healthy: its state and the tail of its log."""
    project = f"label=com.docker.compose.project={env['COMPOSE_PROJECT_NAME']}"
    listed = subprocess.run(["docker", "ps", "-a", "-q", "--filter", project], env=env, capture_output=True,
                            text=True, timeout=30)
    state_format = ("{{.Name}} {{.State.Status}} exit={{.State.ExitCode}}"
                    " {{if .State.Health}}{{.State.Health.Status}}{{end}}")
    told = []
    for container in listed.stdout.split():
        state = subprocess.run(["docker", "inspect", "--format", state_format, container], env=env,
                               capture_output=True, text=True, timeout=30).stdout.strip()
        if state.endswith(" running exit=0 healthy"):
            continue
        log = subprocess.run(["docker", "logs", "--tail", "60", container], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=30).stdout
        told.append(f"--- {state or container}\n{log}")
    return "\n".join(told) or f"(no container of the project is unready; docker ps said: {listed.stderr.strip()})"


def _scraped_agents(url: str) -> dict[str, float]:
    query = urllib.parse.urlencode({"query": 'max by (agent) (max_over_time(up{job="kvtransit"}[10m]))'})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as response:
        result = json.load(response)["data"]["result"]
    return {series["metric"]["agent"]: float(series["value"][1]) for series in result}


def test_compose_runs_a_shaped_scenario_scraped_by_its_prometheus(tmp_path):
    run_id = secrets.token_hex(3)
    # Short: dockerd puts unix sockets under its exec root (108-byte path limit).
    state = Path(tempfile.mkdtemp(prefix="kvtd-", dir="/tmp"))
    state.rmdir()  # engine.sh start creates it, and refuses a dir already holding an engine
    runs = tmp_path / "runs"
    runs.mkdir()
    prometheus_port = _free_port()
    env = dict(os.environ)
    env.update({
        "DOCKER_HOST": f"unix://{state}/docker.sock",
        "COMPOSE_PROJECT_NAME": f"kvtransit{run_id}",
        # The offline path: no registry here, so no image is pulled and no package index is asked.
        "COMPOSE_FILE": OFFLINE_COMPOSE_FILE,
        "COMPOSE_PROFILES": "",  # the default services only, whatever the caller's shell says
        "KVTRANSIT_OFFLINE_BASE_IMAGE": f"kvtransit-base:test-{run_id}",
        "KVTRANSIT_IMAGE_TAG": f"test-{run_id}",
        "KVTRANSIT_RUNS_DIR": str(runs),
        "KVTRANSIT_PROMETHEUS_PORT": str(prometheus_port),
        # Quoted as .env holds it (docker/scenario_env.py): compose shlex-splits the interpolated command, so an
        # empty value (`--trace ''`) must stay a word, or `--trace` has no value and every agent exits at parsing.
        "KVTRANSIT_SCENARIO": shlex.join(_canonical_scenario(SCENARIO)),
    })
    compose = ["docker-compose"]
    engine_started = False
    try:
        _run([str(DOCKER / "engine.sh"), "start", str(state)], env)
        engine_started = True
        _run([str(DOCKER / "build-base.sh"), env["KVTRANSIT_OFFLINE_BASE_IMAGE"]], env)
        _run([str(DOCKER / "build-wheelhouse.sh")], env)
        _run([str(DOCKER / "fetch-prometheus.sh")], env)
        _run([*compose, "build", "-q"], env)
        up = subprocess.run([*compose, "up", "-d"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=STEP_TIMEOUT_S)
        # A dependency that never turns healthy only says "Container <id> is unhealthy": add what it printed.
        assert up.returncode == 0, (f"docker-compose up -d exited {up.returncode}:\n{up.stderr[-3000:]}\n"
                                    + _unready_container_logs(env))

        loadgen = _run([*compose, "ps", "-q", "loadgen"], env).strip()
        exit_code = _run(["docker", "wait", loadgen], env).strip()
        assert exit_code == "0", _run([*compose, "logs", "--no-color", "loadgen"], env)[-3000:]
        report = json.loads((runs / "report.json").read_text())
        assert report["requests"]["total"] == 12
        assert report["requests"]["ok"] + report["requests"]["slo_miss"] == 12, report["requests"]

        # The KV link was shaped by tc inside the middlebox's container, and carried the KV.
        qdiscs = _run([*compose, "exec", "-T", "middlebox", "tc", "-s", "qdisc", "show"], env)
        tbf = re.search(r"qdisc tbf 1: dev \S+ root [^\n]*\n\s*Sent (\d+) bytes", qdiscs)
        assert tbf, qdiscs
        assert int(tbf.group(1)) > 1_000_000, qdiscs  # 12 requests of KV: tens of MB at this scale

        # The compose Prometheus scraped every agent (the loadgen has exited, so ask over the run).
        url = f"http://127.0.0.1:{prometheus_port}"
        deadline = time.monotonic() + 30
        scraped: dict[str, float] = {}
        while time.monotonic() < deadline:
            scraped = _scraped_agents(url)
            if all(scraped.get(agent) == 1.0 for agent in AGENTS):
                break
            time.sleep(1)
        assert {agent: scraped.get(agent) for agent in AGENTS} == dict.fromkeys(AGENTS, 1.0)
    finally:
        try:
            if engine_started:
                subprocess.run([*compose, "down", "--rmi", "all", "--volumes", "--timeout", "5"], cwd=ROOT, env=env,
                               capture_output=True, timeout=120)
                subprocess.run(["docker", "rmi", env["KVTRANSIT_OFFLINE_BASE_IMAGE"]], env=env, capture_output=True,
                               timeout=60)
        finally:
            if state.exists():
                subprocess.run([str(DOCKER / "engine.sh"), "stop", str(state)], capture_output=True, timeout=120)
    assert not state.exists(), "the engine's state dir was not removed"


def _canonical_scenario(flags: list[str]) -> list[str]:
    """The full flag list of a scenario (every field, Scenario.to_argv): what .env's KVTRANSIT_SCENARIO holds."""
    parser = argparse.ArgumentParser()
    add_scenario_args(parser)
    return scenario_from_args(parser.parse_args(flags)).to_argv()
