"""The DEFAULT compose path built for real, where a registry and the package index answer: the agents' image from
the package index (Dockerfile), the official Prometheus and Grafana images pulled, and the official Prometheus
accepting this repository's config and rules. Skipped, with the reason, where they do not answer (the CI box has
no registry: tests/system/test_compose_testbed.py runs the offline path there).

A private Docker engine (docker/engine.sh) unless DOCKER_HOST already names one that answers; everything it made is
torn down in a `finally`, as in test_compose_testbed.py.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
# Docker Hub's registry API (a 401 there means it answers) and PyPI's simple index: what the default build needs.
REGISTRY_URL = "https://registry-1.docker.io/v2/"
INDEX_URL = "https://pypi.org/simple/"
PROBE_TIMEOUT_S = 5.0  # a reachable endpoint answers in well under a second; an unreachable one must not hang
STEP_TIMEOUT_S = 900.0  # one cold build: numpy, scipy and pyfftw wheels from the index

pytestmark = [
    pytest.mark.system,
    pytest.mark.slow,
    pytest.mark.shares_host,  # the build and the official images run: what, not how fast
    pytest.mark.timeout(1800),
    pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker CLI"),
]


def _unreachable(url: str) -> str | None:
    """Why `url` cannot be reached in PROBE_TIMEOUT_S, or None if it answered (any HTTP status is an answer)."""
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {getattr(exc, 'reason', exc)}"


def _compose() -> list[str]:
    """Compose v2 where its plugin is installed, else v1."""
    v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
    if v2.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose") is None:
        pytest.skip("neither `docker compose` (v2) nor docker-compose (v1) is installed")
    return ["docker-compose"]


def _engine_answers(env: dict) -> bool:
    done = subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=30)
    return done.returncode == 0


def _run(argv: list[str], env: dict, timeout: float = STEP_TIMEOUT_S) -> str:
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                                  f"{done.stderr[-3000:]}")
    return done.stdout


def test_the_default_path_builds_from_the_index_and_runs_the_official_images():
    unreachable = [why for url in (REGISTRY_URL, INDEX_URL) if (why := _unreachable(url)) is not None]
    if unreachable:
        pytest.skip("the default build needs a registry and the package index; unreachable here: "
                    + "; ".join(unreachable))
    compose = _compose()
    run_id = secrets.token_hex(3)
    env = dict(os.environ)
    env.update({"COMPOSE_PROJECT_NAME": f"kvtransitdefault{run_id}", "KVTRANSIT_IMAGE_TAG": f"test-{run_id}",
                "COMPOSE_PROFILES": ""})
    env.pop("COMPOSE_FILE", None)  # the default path: docker-compose.yml alone
    state: Path | None = None
    if not _engine_answers(env):
        if os.geteuid() != 0 or shutil.which("dockerd") is None:
            pytest.skip("no Docker engine answers, and starting one needs root and dockerd")
        state = Path(tempfile.mkdtemp(prefix="kvtd-", dir="/tmp"))  # short: dockerd's socket path limit
        state.rmdir()  # engine.sh start creates it
        env["DOCKER_HOST"] = f"unix://{state}/docker.sock"
    image = f"kvtransit:{env['KVTRANSIT_IMAGE_TAG']}"
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    official = [services[name]["image"] for name in ("prometheus", "grafana")]
    try:
        if state is not None:
            _run([str(DOCKER / "engine.sh"), "start", str(state)], env, timeout=120)
        _run([*compose, "build", "decode"], env)  # every agent service builds this one image
        _run([*compose, "pull", "prometheus", "grafana"], env)
        # The image runs kvtransit and has tc for the shaped link.
        assert "usage: kvtransit" in _run(["docker", "run", "--rm", image, "kvtransit", "--help"], env, 120)
        _run(["docker", "run", "--rm", image, "tc", "-V"], env, 120)
        # The official Prometheus accepts this repository's config and rules, as the compose service mounts them.
        mount = f"{ROOT / 'prometheus'}:/etc/kvtransit/prometheus:ro"
        _run(["docker", "run", "--rm", "--entrypoint", "promtool", "-v", mount, official[0], "check", "config",
              "/etc/kvtransit/prometheus/prometheus.yml"], env, 120)
    finally:
        try:
            # Only what this test made: on an engine the caller runs, its official images stay.
            subprocess.run(["docker", "rmi", image, *(official if state is not None else [])], env=env,
                           capture_output=True, timeout=120)
        finally:
            if state is not None and state.exists():
                subprocess.run([str(DOCKER / "engine.sh"), "stop", str(state)], capture_output=True, timeout=120)
