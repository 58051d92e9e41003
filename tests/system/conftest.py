"""The system tests' shared fixtures: one private Docker engine with the offline images, built once a session.

The compose testbed and the Swarm stack both run the images `docker-compose.offline.yml` builds (the debootstrap
base, the host wheelhouse, Debian's Prometheus): building them is most of either test's time (benchmarks/RESULTS.md,
"Docker on this machine"), so one engine and one build serve both. Each test still has its own compose project or
stack, named for it, and removes it; the session removes the images by exact name and stops the engine by its pid
(tests/system/_docker_engine.py: private_engine undoes what the engine did to the host).
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator

import pytest

from ._docker_engine import ROOT, build_offline_images, offline_env, offline_images, private_engine


@pytest.fixture(scope="session")
def offline_engine() -> Iterator[dict[str, str]]:
    """The environment of a private engine holding the offline images (KVTRANSIT_IMAGE_TAG and the base)."""
    run_id = secrets.token_hex(3)
    env = dict(os.environ)
    env.update(offline_env(run_id))
    env.update({
        "COMPOSE_PROJECT_NAME": f"kvtransit{run_id}",  # the build's project; each test names its own
        "KVTRANSIT_PROMETHEUS_IMAGE": f"kvtransit-prometheus:{env['KVTRANSIT_IMAGE_TAG']}",
        # `kvtransit …` from this checkout, whichever checkout the editable install points at.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    })
    with private_engine(env) as env:
        try:
            build_offline_images(env)
            yield env
        finally:
            subprocess.run(["docker", "rmi", *offline_images(env)], env=env, capture_output=True, timeout=120)
