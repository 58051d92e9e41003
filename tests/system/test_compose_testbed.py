"""`docker-compose up` for real, the OFFLINE path: a private Docker engine, the debootstrap base, the images from
the host wheelhouse and Prometheus binary (docker-compose.offline.yml over docker-compose.yml, selected by
COMPOSE_FILE), a short shaped run.

Checks that the run completed (the loadgen's report), that tc shaped the KV link inside the middlebox's
container (`tc -s qdisc`: a tbf that carried bytes), and that the compose Prometheus scraped every agent.
Then the compose project (containers, networks, volumes) is torn down in a `finally`. The engine and the images
are the session's (tests/system/conftest.py, which test_swarm_stack.py shares): removed by exact name, and the engine
stopped by its pid with the nftables tables, bridges and ip_forward it changed undone (docker/engine.sh). The build
is about 1.5 minutes cold on a 2-core box (benchmarks/RESULTS.md, "Docker on this machine"), the run seconds.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shlex
import subprocess

import pytest

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args

from ._docker_engine import (
    AGENTS,
    REQUIRES_ENGINE,
    ROOT,
    SCENARIO,
    STEP_TIMEOUT_S,
    agents_scraped,
    free_port,
)
from ._docker_engine import run as _run

pytestmark = [pytest.mark.system, pytest.mark.timeout(600), *REQUIRES_ENGINE,
              pytest.mark.shares_host]  # containers up, scraped, every request accounted for


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


def test_compose_runs_a_shaped_scenario_scraped_by_its_prometheus(tmp_path, offline_engine):
    run_id = secrets.token_hex(3)
    runs = tmp_path / "runs"
    runs.mkdir()
    prometheus_port = free_port()
    env = dict(offline_engine)  # the session's engine and images (tests/system/conftest.py)
    env.update({
        "COMPOSE_PROJECT_NAME": f"kvtransit{run_id}",
        "KVTRANSIT_RUNS_DIR": str(runs),
        "KVTRANSIT_PROMETHEUS_PORT": str(prometheus_port),
        # Quoted as .env holds it (docker/scenario_env.py): compose shlex-splits the interpolated command, so an
        # empty value (`--trace ''`) must stay a word, or `--trace` has no value and every agent exits at parsing.
        "KVTRANSIT_SCENARIO": shlex.join(_canonical_scenario(SCENARIO)),
    })
    compose = ["docker-compose"]
    try:
        _compose_run(compose, env, runs, prometheus_port)
    finally:
        # This project's containers, networks and volumes; its images are the session's, removed by name there.
        subprocess.run([*compose, "down", "--volumes", "--timeout", "5"], cwd=ROOT, env=env, capture_output=True,
                       timeout=120)


def _compose_run(compose: list[str], env: dict, runs, prometheus_port: int) -> None:
    """`up` on the session's images, and check the run, its tc shaping and the scraping (the caller tears the
    project down)."""
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
    assert agents_scraped(f"http://127.0.0.1:{prometheus_port}", AGENTS) == dict.fromkeys(AGENTS, 1.0)


def _canonical_scenario(flags: list[str]) -> list[str]:
    """The full flag list of a scenario (every field, Scenario.to_argv): what .env's KVTRANSIT_SCENARIO holds."""
    parser = argparse.ArgumentParser()
    add_scenario_args(parser)
    return scenario_from_args(parser.parse_args(flags)).to_argv()
