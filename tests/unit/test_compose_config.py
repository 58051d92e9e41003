"""docker-compose.yml is valid, and each agent service runs the very command `kvtransit up` runs for that role.

"The same command" is checked on what the command *means*: both argv lists are parsed by that role's own
`kvtransit ROLE` parser and compared field by field, with the addresses (containers' host names vs the
launcher's 127.0.0.1 and free ports) left out.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvtransit.cli import build_parser
from kvtransit.harness.up.agent_commands import agent_commands
from kvtransit.model.scenario import Scenario
from kvtransit.shaping.commands import NAMESPACE_SYSCTLS

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ("decode", "middlebox", "prefill", "loadgen")
# Flags whose values are addresses, paths or names: they differ between containers and the embedded launcher
# by design (host names vs 127.0.0.1 and free ports; a report under /runs; a process name).
PLACE_DEPENDENT = {"listen", "client_listen", "metrics_listen", "control_listen", "decode", "kv_to", "prefill_at",
                   "decode_clients", "stats", "report", "name"}


@pytest.fixture(scope="module")
def compose() -> dict:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not on PATH (apt-get install docker-compose)")
    done = subprocess.run(["docker-compose", "config"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def _env_scenario_argv() -> list[str]:
    lines = [line for line in (ROOT / ".env").read_text().splitlines() if line.startswith("KVTRANSIT_SCENARIO=")]
    assert len(lines) == 1, ".env must set KVTRANSIT_SCENARIO exactly once"
    return shlex.split(lines[0].split("=", 1)[1])


def _meaning(argv: list[str]) -> dict:
    """The parsed flags of `kvtransit ROLE ...` (argv without the program), addresses left out."""
    args = vars(build_parser().parse_args(argv))
    return {k: v for k, v in args.items() if k not in PLACE_DEPENDENT and k != "func"}


@pytest.mark.slow  # starts a process
def test_docker_compose_accepts_the_file():
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not on PATH (apt-get install docker-compose)")
    done = subprocess.run(["docker-compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_env_scenario_is_a_complete_canonical_scenario():
    """Every Scenario field spelled out, in to_argv's form: what the launcher passes to every process."""
    argv = _env_scenario_argv()
    parsed = _meaning(["up", *argv])
    scenario = Scenario.build(**{k.removeprefix("scenario_"): v for k, v in parsed.items()
                                 if k.startswith("scenario_")})
    assert argv == scenario.to_argv()


@pytest.mark.parametrize("role", AGENTS)
def test_each_agent_service_runs_its_role_with_the_env_scenario(compose, role):
    command = shlex.split(compose["services"][role]["command"])
    assert command[:2] == ["kvtransit", role]
    meaning = _meaning(command[1:])  # the role's own parser accepts every flag
    expected = _meaning([role, *_env_scenario_argv(), *_required_addresses(role)])
    assert {k: v for k, v in meaning.items() if k.startswith("scenario_")} == \
        {k: v for k, v in expected.items() if k.startswith("scenario_")}


def _required_addresses(role: str) -> list[str]:
    """Placeholder values for the flags a role requires, so its parser accepts the scenario alone."""
    return {"middlebox": ["--decode", "x:1"], "prefill": ["--kv-to", "x:1"],
            "loadgen": ["--prefill", "x:1", "--decode-clients", "x:1"]}.get(role, [])


@pytest.mark.parametrize("role", AGENTS)
def test_each_agent_service_runs_the_command_the_embedded_launcher_runs(compose, role):
    parsed = _meaning(["up", *_env_scenario_argv()])
    scenario = Scenario.build(**{k.removeprefix("scenario_"): v for k, v in parsed.items()
                                 if k.startswith("scenario_")})
    # Compose shapes the KV link with tc inside the middlebox's container: the launcher's tc mode (netns).
    embedded = agent_commands(scenario, link_backend="tc")[role]
    program = embedded.index(role)  # after `python -m kvtransit.cli`
    command = shlex.split(compose["services"][role]["command"])
    assert _meaning(command[1:]) == _meaning(embedded[program:])


def test_every_python_service_has_an_init_and_a_healthcheck(compose):
    for name in (*AGENTS, "prometheus"):
        service = compose["services"][name]
        assert service.get("init") is True, f"{name}: Python as PID 1 ignores SIGTERM"
        assert "healthcheck" in service, name


def test_only_the_middlebox_may_shape_and_it_shapes_the_kv_link(compose):
    services = compose["services"]
    assert services["middlebox"]["cap_add"] == ["NET_ADMIN"]
    assert services["middlebox"]["environment"]["KVTRANSIT_SHAPE_TO"] == "decode-link"
    assert "decode-link" in services["decode"]["networks"]["kvlink"]["aliases"]
    assert "decode-link:" in services["middlebox"]["command"]
    assert [n for n in AGENTS if services[n].get("cap_add")] == ["middlebox"]


def test_grafana_starts_by_default_provisioned_from_the_repository(compose):
    # The default path pulls the official images (a registry is there); the offline override puts Grafana behind
    # a profile again (tests/unit/test_compose_files.py).
    grafana = compose["services"]["grafana"]
    assert all("profiles" not in compose["services"][name] for name in (*AGENTS, "prometheus", "grafana"))
    mounts = {v.split(":")[1] if isinstance(v, str) else v["target"] for v in grafana["volumes"]}
    assert mounts == {"/etc/grafana/provisioning", "/var/lib/grafana/dashboards"}


@pytest.mark.parametrize("role", AGENTS)
def test_each_agent_container_keeps_its_tcp_window_over_idle_gaps_as_a_netns_run_does(compose, role):
    sysctls = compose["services"][role].get("sysctls") or {}
    assert {key: str(value) for key, value in sysctls.items()} == dict(NAMESPACE_SYSCTLS)
