"""The compose files for both paths: valid for Compose v2 (the vendored compose-spec schema) and v1 (`docker-compose
config`); the default path needs nothing on the host but Docker; the offline override builds everything from the
host; the KV pool profile wires the pool in as `kvtransit up` does.

Compose v2's plugin is not installed on the CI box, so v2 is checked against the schema it validates with
(docker/compose-spec/, vendored with its source and version); v1 is the real `docker-compose` where installed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kvtransit.cli import build_parser
from kvtransit.flows.tier.launch import pool_argv
from kvtransit.harness.up.agent_commands import agent_commands
from kvtransit.harness.up.flow_launch import flow_launches
from kvtransit.model.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "docker" / "compose-spec"
DEFAULT_FILE = "docker-compose.yml"
OFFLINE_FILE = "docker-compose.offline.yml"
AGENTS = ("decode", "middlebox", "prefill", "loadgen", "kvpool")
# Flags whose values are addresses, paths or names: containers' host names vs the launcher's 127.0.0.1 and free
# ports (as tests/unit/test_compose_config.py leaves them out). Pool addresses included: what is compared is that
# each is given, below.
PLACE_DEPENDENT = {"listen", "client_listen", "metrics_listen", "control_listen", "decode", "kv_to", "prefill_at",
                   "decode_clients", "stats", "report", "name", "kvpool", "pool_listen", "kv_pool_via"}
# Where the official images come from (the issue: Prometheus and Grafana from their official images, pinned).
OFFICIAL_IMAGES = {"prometheus": "prom/prometheus", "grafana": "grafana/grafana"}
POOL_SCENARIO = ["--kv-pool", "pool", "--prefix-workload", "system-prompts", "--requests", "8"]


def _schema_validator() -> jsonschema.Draft7Validator:
    schema = yaml.safe_load((SCHEMA_DIR / "compose-spec.json").read_text())
    return jsonschema.Draft7Validator(schema)


def _schema_errors(document: dict) -> list[str]:
    return [f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
            for error in _schema_validator().iter_errors(document)]


def _docker_compose_config(files: list[str], env: dict[str, str] | None = None) -> dict:
    """The merged, interpolated model Compose v1 makes of `files` (skips where docker-compose is missing)."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not on PATH (apt-get install docker-compose)")
    argv = ["docker-compose", *(arg for name in files for arg in ("-f", name)), "config"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def _scenario_env_module():
    spec = importlib.util.spec_from_file_location("kvtransit_scenario_env", ROOT / "docker" / "scenario_env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_vendored_schema_is_the_file_its_readme_names():
    readme = (SCHEMA_DIR / "README.md").read_text()
    digest = hashlib.sha256((SCHEMA_DIR / "compose-spec.json").read_bytes()).hexdigest()
    assert f"{digest}  compose-spec.json" in readme, "compose-spec.json changed: update docker/compose-spec/README.md"
    assert (SCHEMA_DIR / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_the_schema_rejects_what_compose_v2_rejects():
    """The check can fail: a misspelt service key and a mistyped value are reported, with their place."""
    broken = {"services": {"decode": {"image": "x", "helthcheck": {}},
                           "middlebox": {"image": "x", "cap_add": "NET_ADMIN"}}}
    errors = _schema_errors(broken)
    assert any(e.startswith("services/decode") and "helthcheck" in e for e in errors), errors
    assert any(e.startswith("services/middlebox/cap_add") for e in errors), errors


@pytest.mark.parametrize("name", [DEFAULT_FILE, OFFLINE_FILE])
def test_each_compose_file_follows_the_compose_spec_schema(name):
    assert _schema_errors(yaml.safe_load((ROOT / name).read_text())) == []


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("files", [[DEFAULT_FILE], [DEFAULT_FILE, OFFLINE_FILE]], ids=["default", "offline"])
def test_each_path_is_accepted_by_compose_v1_and_its_merged_model_by_the_v2_schema(files):
    merged = _docker_compose_config(files)
    merged.pop("version", None)  # v1 may print the format version it read; the spec only deprecates it
    assert _schema_errors(merged) == []


@pytest.mark.slow  # starts a process
def test_the_default_path_builds_from_the_package_index_and_pulls_official_pinned_images():
    services = _docker_compose_config([DEFAULT_FILE])["services"]
    for role in AGENTS:
        assert services[role]["build"]["dockerfile"] == "Dockerfile", role
    dockerfile = "\n".join(line for line in (ROOT / "Dockerfile").read_text().splitlines()
                           if not line.startswith("#"))
    assert "wheelhouse" not in dockerfile and "--no-index" not in dockerfile, "the default build needs no host wheels"
    assert re.search(r"^COPY src ", dockerfile, re.MULTILINE), "the default build installs this context's source"
    for name, repository in OFFICIAL_IMAGES.items():
        service = services[name]
        assert "build" not in service, f"{name}: the official image, not one built from host files"
        image, _, tag = service["image"].partition(":")
        assert image == repository and tag and tag != "latest", f"{name}: pin a tag of {repository}"


@pytest.mark.slow  # starts a process
def test_the_default_path_starts_grafana_provisioned_from_the_repository():
    services = _docker_compose_config([DEFAULT_FILE])["services"]
    assert all("profiles" not in services[name] for name in ("decode", "middlebox", "prefill", "loadgen",
                                                               "prometheus", "grafana"))
    grafana = services["grafana"]
    mounts = {v.split(":")[0] if isinstance(v, str) else v["source"]: v.split(":")[1] if isinstance(v, str)
              else v["target"] for v in grafana["volumes"]}
    assert mounts == {str(ROOT / "dashboards" / "provisioning"): "/etc/grafana/provisioning",
                      str(ROOT / "dashboards" / "json"): "/var/lib/grafana/dashboards"}
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards" / "json" / Path(home).name).is_file(), home


@pytest.mark.slow  # starts a process
def test_prometheus_runs_the_same_command_on_both_paths():
    default = _docker_compose_config([DEFAULT_FILE])["services"]["prometheus"]
    offline = _docker_compose_config([DEFAULT_FILE, OFFLINE_FILE])["services"]["prometheus"]
    assert default["command"] == offline["command"]
    assert "--config.file=/etc/kvtransit/prometheus/prometheus.yml" in default["command"]
    # The official image has busybox's wget and no Python; the offline image has Python and no wget.
    assert default["healthcheck"]["test"][1] == "wget"
    assert offline["healthcheck"]["test"][1] == "python3"


@pytest.mark.slow  # starts a process
def test_the_offline_path_builds_everything_from_the_host_and_pulls_nothing_by_default():
    services = _docker_compose_config([DEFAULT_FILE, OFFLINE_FILE])["services"]
    for role in AGENTS:
        assert services[role]["build"]["dockerfile"] == "Dockerfile.offline", role
        assert services[role]["build"]["args"]["BASE_IMAGE"] == "kvtransit-base:bookworm", role
    assert services["prometheus"]["build"]["dockerfile"] == "docker/prometheus.Dockerfile"
    assert "--no-index" in (ROOT / "Dockerfile.offline").read_text()
    pulled = [name for name, service in services.items() if "build" not in service]
    assert pulled == ["grafana"] and services["grafana"]["profiles"] == ["grafana"], \
        "offline, only an opt-in service may need a registry"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule, as far as these files use it: the last pattern matching the path or one of its
    parent directories wins; `!` lets it back in."""
    parents = [str(Path(path).parents[i]) for i in range(len(Path(path).parts) - 1)]
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        glob = pattern.removeprefix("!")
        globs = [glob, glob.removeprefix("**/")] if glob.startswith("**/") else [glob]
        if any(fnmatch.fnmatch(candidate, g) for candidate in (path, *parents) for g in globs):
            ignored = not keep
    return ignored


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.offline", "docker/prometheus.Dockerfile"])
def test_every_file_a_dockerfile_copies_is_in_the_build_context(dockerfile):
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    copied = [source for line in (ROOT / dockerfile).read_text().splitlines() if line.startswith("COPY ")
              for source in line.split()[1:-1]]
    assert copied, dockerfile
    assert [source for source in copied if _ignored(source.rstrip("/"), patterns)] == []
    assert _ignored("src/kvtransit/__pycache__/cli.cpython-311.pyc", patterns), "build leftovers stay out"
    assert _ignored("tests/unit/test_compose_files.py", patterns)


@dataclass
class _StartedLauncher:
    """The launcher as a flow's LAUNCH sees it once every process is up (harness/up/flow_launch.py:
    LaunchContext), its addresses made up: they are place dependent, left out of the comparison."""

    scenario: Scenario
    frontend: Any = None
    restart_roles: tuple[str, ...] = ()

    def host(self, place: str, socket: str = "front") -> str:
        return "127.0.0.1"

    def ready_lines(self, role: str) -> list[dict[str, Any]]:
        return [{"listen_port": 1}]

    def addresses(self, role: str, port_key: str) -> str:
        return "127.0.0.1:2"


@pytest.mark.slow  # starts a process
def test_the_kvpool_profile_wires_the_pool_in_as_kvtransit_up_does():
    """With the .env lines docker/scenario_env.py prints for a `--kv-pool pool` scenario, the middlebox dials the
    pool, the prefill reaches it through the middlebox's pool port and the load generator reads its /stats: the
    launcher's commands for that scenario, flag for flag (addresses aside)."""
    lines = _scenario_env_module().env_lines(POOL_SCENARIO)
    env = dict(line.split("=", 1) for line in lines)
    assert env["COMPOSE_PROFILES"] == "kvpool"
    services = _docker_compose_config([DEFAULT_FILE], env)["services"]
    assert services["kvpool"]["profiles"] == ["kvpool"]
    assert "depends_on" not in services["middlebox"] or "kvpool" not in services["middlebox"]["depends_on"], \
        "a service may not depend on one whose profile is off"
    argv = shlex.split(env["KVTRANSIT_SCENARIO"])
    parsed = vars(build_parser().parse_args(["up", *argv]))
    scenario = Scenario.build(**{k.removeprefix("scenario_"): v for k, v in parsed.items()
                                 if k.startswith("scenario_")})
    embedded = {**agent_commands(scenario, link_backend="tc", stats="127.0.0.1:3"),
                "kvpool": pool_argv(scenario, "127.0.0.1")}  # the tier's own process (flows/tier/launch.py)
    started = _StartedLauncher(scenario)
    for launch in flow_launches(scenario):  # the flags a flow adds, as the launcher asks for them
        for role in AGENTS:
            embedded[role] += launch.flags(started, role, 0)
    for role in AGENTS:
        command = vars(build_parser().parse_args(shlex.split(services[role]["command"])[1:]))
        launcher = vars(build_parser().parse_args(embedded[role][embedded[role].index(role):]))
        assert {k: v for k, v in command.items() if k not in PLACE_DEPENDENT and k != "func"} == \
            {k: v for k, v in launcher.items() if k not in PLACE_DEPENDENT and k != "func"}, role
        for flag in ("kvpool", "kv_pool_via"):
            assert (command.get(flag) is None) == (launcher.get(flag) is None), (role, flag)
    middlebox = vars(build_parser().parse_args(shlex.split(services["middlebox"]["command"])[1:]))
    assert (middlebox["kvpool"], middlebox["pool_listen"]) == ("kvpool:9000", "0.0.0.0:9300")
    prefill = vars(build_parser().parse_args(shlex.split(services["prefill"]["command"])[1:]))
    assert prefill["kv_pool_via"] == "middlebox:9300"
    loadgen = vars(build_parser().parse_args(shlex.split(services["loadgen"]["command"])[1:]))
    assert "kvpool:9100" in loadgen["stats"].split(",")


def test_without_the_pool_the_env_is_the_one_scenario_line():
    lines = _scenario_env_module().env_lines(["--rate", "4"])
    assert len(lines) == 1 and lines[0].startswith("KVTRANSIT_SCENARIO=--model ")
