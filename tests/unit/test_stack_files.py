"""docker-stack.yml (the testbed as a Docker Swarm stack) stays in step with docker-compose.yml: the same services
(kvpool and Grafana excepted: a compose profile, and a registry image), each with the same image, command,
environment, sysctls, healthcheck, init, capabilities, volumes and networks; plus what a stack needs and compose
has not (deploy: dnsrr, placement by role label, the load generator held at 0 replicas), and none of what a stack
refuses. The names `kvtransit swarm` drives the stack by (harness/deploy/swarm/stack.py) are the file's.

Where the Docker CLI has `docker stack config` (CLI 23+, client-side: no engine), its own stack loader reads the file
and must give every agent the scenario `kvtransit swarm run` sets; tests/system/test_swarm_stack.py deploys it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvtransit.cli import build_parser
from kvtransit.harness.deploy.swarm.stack import CLIENT, NETWORKS, PLACEMENT, SERVING, constraint, stack_env
from kvtransit.model.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ("decode", "middlebox", "prefill", "loadgen")
# docker-compose.yml's services that the stack leaves out, and why (docker-stack.yml's header says the same).
LEFT_OUT = {"kvpool": "a compose profile; a stack has no profiles", "grafana": "a registry image CI cannot pull"}
SAME_AS_COMPOSE = ("image", "command", "environment", "sysctls", "healthcheck", "init", "cap_add", "volumes",
                   "networks")
# A stack does not build, ignores depends_on (and the CLI refuses its long form), and the CLI refuses profiles.
NOT_IN_A_STACK = ("build", "depends_on", "profiles")


def _services(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())["services"]


@pytest.fixture(scope="module")
def stack() -> dict:
    return _services("docker-stack.yml")


@pytest.fixture(scope="module")
def compose() -> dict:
    return _services("docker-compose.yml")


def test_the_stack_has_every_compose_service_a_stack_can_run_and_the_helper_knows_them(stack, compose):
    assert set(stack) == set(compose) - set(LEFT_OUT)
    assert set(stack) == set(PLACEMENT)


@pytest.mark.parametrize("role", AGENTS)
def test_each_agent_service_is_its_compose_service(stack, compose, role):
    for key in SAME_AS_COMPOSE:
        assert stack[role].get(key) == compose[role].get(key), (role, key)


def test_prometheus_runs_the_compose_command_and_config_with_either_path_s_image_and_check(stack, compose):
    ours, default = stack["prometheus"], compose["prometheus"]
    offline = _services("docker-compose.offline.yml")["prometheus"]
    for key in ("command", "volumes", "init", "networks"):
        assert ours[key] == default[key], key
    # The official image by default; the offline one by name (docker-compose.offline.yml's, at the same tag).
    assert ours["image"] == "${KVTRANSIT_PROMETHEUS_IMAGE:-" + default["image"] + "}"
    assert offline["image"].startswith("kvtransit-prometheus:")
    # One check that passes in either image: compose's default test, else the offline file's.
    kind, shell = ours["healthcheck"]["test"]
    first, _, second = shell.partition(" || ")
    assert kind == "CMD-SHELL"
    assert ["CMD", *shlex.split(first)] == default["healthcheck"]["test"]
    assert ["CMD", *shlex.split(second)] == offline["healthcheck"]["test"]
    assert {k: v for k, v in ours["healthcheck"].items() if k != "test"} == \
        {k: v for k, v in default["healthcheck"].items() if k != "test"}
    # Published on the node itself (ingress publishing is IPVS), on the port variable compose uses.
    assert default["ports"] == ["127.0.0.1:${KVTRANSIT_PROMETHEUS_PORT:-9090}:9090"]
    assert ours["ports"] == [{"target": 9090, "published": "${KVTRANSIT_PROMETHEUS_PORT:-9090}", "mode": "host"}]


def test_no_service_has_what_a_stack_refuses_or_ignores(stack):
    assert {name: sorted(set(service) & set(NOT_IN_A_STACK)) for name, service in stack.items()} == \
        {name: [] for name in stack}


def test_every_service_is_reached_by_dns_round_robin_and_placed_by_its_role_label(stack):
    for name, service in stack.items():
        deploy = service["deploy"]
        assert deploy["endpoint_mode"] == "dnsrr", name  # a service VIP needs IPVS
        assert deploy["placement"]["constraints"] == [constraint(PLACEMENT[name])], name


def test_the_load_generator_waits_at_zero_replicas_and_runs_once_while_the_others_restart_until_peers_answer(stack):
    client = stack[CLIENT]["deploy"]
    assert (client["replicas"], client["restart_policy"]["condition"]) == (0, "none")
    for name in SERVING:
        assert stack[name]["deploy"].get("replicas", 1) == 1, name
    for name in ("decode", "middlebox", "prefill"):
        assert stack[name]["deploy"]["restart_policy"]["condition"] == "on-failure", name


def test_the_networks_are_compose_s_as_overlays():
    document = yaml.safe_load((ROOT / "docker-stack.yml").read_text())
    assert set(document["networks"]) == set(NETWORKS) == set(yaml.safe_load((ROOT / "docker-compose.yml")
                                                                            .read_text())["networks"])
    assert {name: network["driver"] for name, network in document["networks"].items()} == \
        dict.fromkeys(NETWORKS, "overlay")


def test_the_stack_names_a_version_debian_s_docker_cli_requires():
    # Debian's docker 20.10 CLI: "unsupported Compose file version: 1.0" without one (measured).
    assert yaml.safe_load((ROOT / "docker-stack.yml").read_text())["version"] == "3.8"


def _stack_config(env: dict[str, str]) -> dict:
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI on PATH")
    usage = subprocess.run(["docker", "stack", "--help"], capture_output=True, text=True, timeout=30).stdout
    if "config" not in {line.split()[0] for line in usage.splitlines() if line.startswith("  ") and line.split()}:
        pytest.skip("this Docker CLI has no `docker stack config` (CLI 23+)")
    done = subprocess.run(["docker", "stack", "config", "-c", "docker-stack.yml"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["services"]


@pytest.mark.slow  # starts a process
def test_the_docker_cli_reads_the_stack_and_gives_every_agent_the_scenario_the_helper_sets(tmp_path):
    # A scenario with an empty value (--trace ''), which must stay one word when the CLI splits the command.
    scenario = Scenario(requests=12, rate=4.0, prompt_mean=512.0, output_mean=32.0, seed=3)
    assert "''" in shlex.join(scenario.to_argv())
    services = _stack_config({**os.environ, **stack_env(scenario, tmp_path)})
    for role in AGENTS:
        command = services[role]["command"]
        assert command[:2] == ["kvtransit", role], command
        parsed = vars(build_parser().parse_args(command[1:]))
        assert Scenario.build(**{k.removeprefix("scenario_"): v for k, v in parsed.items()
                           if k.startswith("scenario_")}) == scenario, role
    assert services["middlebox"]["cap_add"] == ["NET_ADMIN"]
    assert services[CLIENT]["volumes"][0]["source"] == str(tmp_path.resolve())
