"""What each role's process is run as: its argv, the scenario's flags then the role's own (`agent_commands`).

The launcher runs these (peer addresses filled in as it learns them from readiness lines), the compose file runs
the very same commands (tests/unit/test_compose_config.py holds the two together), and the Kubernetes manifests
are rendered from them too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from kvtransit.harness.up.placement import LOOPBACK
from kvtransit.model.scenario import Scenario

AGENT_MODULE = [sys.executable, "-m", "kvtransit.cli"]
ANY_PORT = "127.0.0.1:0"


@dataclass(frozen=True)
class FrontendOptions:
    """`kvtransit up --frontend`: the OpenAI front end's own flags (cli/frontend.py), handed to its process."""

    listen: str = "127.0.0.1:8000"
    max_requests: int = 0  # end the run after this many requests (0: no count limit)
    duration_s: float = 0.0  # end the run this many wall seconds after it starts (0: none)
    tokenizer: str = "auto"
    served_model: str | None = None

    def to_argv(self) -> list[str]:
        argv = ["--openai-listen", self.listen, "--max-requests", str(self.max_requests),
                "--duration", repr(float(self.duration_s)), "--tokenizer", self.tokenizer]
        return argv + (["--served-model-name", self.served_model] if self.served_model else [])


def _any_port(host: str) -> str:
    return f"{host}:0"


def agent_commands(scenario: Scenario, *, index: int = 0, decode_kv: str = ANY_PORT, middlebox_kv: str = ANY_PORT,
                   prefills: str = ANY_PORT, decode_clients: str = ANY_PORT, stats: str = "",
                   report: str = "kvtransit-report.json", accuracy_sample: int = 8,
                   drain_timeout_s: float | None = None,
                   middlebox_command: list[str] | None = None, link_backend: str = "userspace",
                   hosts: Callable[[str, str], str] | None = None,
                   frontend: FrontendOptions | None = None) -> dict[str, list[str]]:
    """The argv of each role's process (instance `index`), as the launcher runs them: the scenario's flags, then
    the role's own. Peer addresses are what is known so far (the launcher learns them from readiness lines);
    the compose file runs the very same commands (tests/unit/test_compose_config.py holds the two together).
    `link_backend` "tc": the kernel shapes the link's rate (middlebox and decode are told); `hosts(role,
    socket)` is where a role's sockets listen ("kv": decode's KV ingress, "front": the rest; default loopback).
    "frontend": the OpenAI front end in the load generator's place (`frontend`: its flags; default
    FrontendOptions()). A flow adds flags of its own to these, and processes of its own beside them (its LAUNCH,
    harness/up/flow_launch.py)."""
    scenario_argv = scenario.to_argv()
    host: Callable[[str, str], str] = hosts or (lambda _role, _socket: LOOPBACK)

    def agent(role: str, *extra: str) -> list[str]:
        return [*AGENT_MODULE, role, *scenario_argv, "--name", f"{role}-{index}",
                "--metrics-listen", _any_port(host(role, "front")), *extra]

    client_flags = ["--prefill", prefills, "--decode-clients", decode_clients, "--report", report]
    if stats:
        client_flags += ["--stats", stats]
    if drain_timeout_s is not None:
        client_flags += ["--drain-timeout", repr(float(drain_timeout_s))]
    loadgen = agent("loadgen", *client_flags)
    backend = ["--link-backend", link_backend] if link_backend != "userspace" else []
    middlebox_host = host("middlebox", "front")
    return {
        "decode": agent("decode", "--listen", _any_port(host("decode", "kv")),
                        "--client-listen", _any_port(host("decode", "front")),
                        "--accuracy-sample", str(accuracy_sample), *backend),
        "middlebox": [*(middlebox_command or [*AGENT_MODULE, "middlebox"]), *scenario_argv,
                      "--name", f"middlebox-{index}", "--listen", _any_port(middlebox_host), "--decode", decode_kv,
                      "--metrics-listen", _any_port(middlebox_host), "--control-listen", _any_port(middlebox_host),
                      *backend],
        "prefill": agent("prefill", "--listen", ANY_PORT, "--kv-to", middlebox_kv),
        "loadgen": loadgen,
        "frontend": agent("frontend", *client_flags, *(frontend or FrontendOptions()).to_argv()),
    }
