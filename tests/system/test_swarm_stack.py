"""`docker stack deploy` for real: docker-stack.yml on a single-node swarm, on the private engine the compose test
starts (tests/system/_docker_engine.py), with the offline images, driven by `kvtransit swarm run`.

Two runs on one swarm (a module fixture: the swarm and its labels are made once, on the session's engine and
images, tests/system/conftest.py, which the compose test shares). One node
carries every placement label (`kvtransit.ROLE=true`), so every constraint holds on it; the services reach
each other over the stack's overlay networks by name (endpoint_mode dnsrr: this kernel has no IPVS for service VIPs).
The run is short (12 requests); its report must account for every request (ok, slo-miss, or failed with a reason),
its ledger must pass the chaos tests' checks, tc must have shaped the middlebox's egress, and the stack's Prometheus
must have scraped every agent. A run whose decode cannot start fails in one line naming it, and its stack is removed
all the same. Then everything goes, by exact name: the stack, its networks (waited for: a removal
races the next deploy), the swarm (`docker swarm leave --force`) and the docker_gwbridge network and link it leaves;
the session then removes the images and stops the engine by its pid (docker/engine.sh).

Skips where the kernel cannot make a VXLAN link (what an overlay network is), saying so. About a minute once the
session's images are built (the builds, about 1.5 minutes, are the session's: whichever test comes first pays).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kvtransit.harness.deploy.swarm.stack import PLACEMENT, network_names
from kvtransit.harness.deploy.swarm.stack_run import remove_stack
from kvtransit.model.judge import ledger_check

from ._docker_engine import (
    AGENTS,
    REQUIRES_ENGINE,
    ROOT,
    SCENARIO,
    STEP_TIMEOUT_S,
    agents_scraped,
    free_port,
    run,
)

GWBRIDGE = "docker_gwbridge"  # the bridge swarm makes for its containers' way out; `swarm leave` does not remove it

pytestmark = [pytest.mark.system, pytest.mark.timeout(600), *REQUIRES_ENGINE,
              pytest.mark.shares_host]  # the stack runs and every request is accounted for


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, timeout=10).returncode == 0


def _no_overlay(probe: str) -> str | None:
    """Why this kernel cannot carry an overlay network (None: it can). An overlay network is a VXLAN link in the
    network's namespace; make one (named `probe`, a name of our own) and delete it by that name."""
    made = subprocess.run(["ip", "link", "add", probe, "type", "vxlan", "id", "4242", "dstport", "4789",
                           "local", "127.0.0.1"], capture_output=True, text=True, timeout=10)
    if made.returncode != 0:
        return f"this kernel cannot make a VXLAN link, which a swarm overlay network is: {made.stderr.strip()}"
    subprocess.run(["ip", "link", "delete", probe], capture_output=True, timeout=10)
    return None


@dataclass(frozen=True)
class Swarm:
    env: dict
    hostname: str  # the one node's


@pytest.fixture(scope="module")
def swarm(request: pytest.FixtureRequest) -> Iterator[Swarm]:
    run_id = secrets.token_hex(3)
    why = _no_overlay(f"kvtvx{run_id}")
    if why:
        pytest.skip(why)
    gwbridge_before = _link_exists(GWBRIDGE)
    # The session's engine and images (tests/system/conftest.py); the swarm is this module's.
    env = {**request.getfixturevalue("offline_engine"), "KVTRANSIT_PROMETHEUS_PORT": str(free_port())}
    in_swarm = False
    try:
        run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"], env)
        in_swarm = True
        node = run(["docker", "info", "--format", "{{.Swarm.NodeID}}"], env).strip()
        labels = [arg for label in sorted(set(PLACEMENT.values())) for arg in ("--label-add", f"{label}=true")]
        run(["docker", "node", "update", *labels, node], env)
        hostname = run(["docker", "node", "inspect", "--format", "{{.Description.Hostname}}", node], env).strip()
        yield Swarm(env, hostname)
    finally:
        if in_swarm:
            subprocess.run(["docker", "swarm", "leave", "--force"], env=env, capture_output=True, timeout=120)
            networks = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], env=env,
                                      capture_output=True, text=True, timeout=60).stdout.split()
            if GWBRIDGE in networks:
                subprocess.run(["docker", "network", "rm", GWBRIDGE], env=env, capture_output=True, timeout=60)
        if not gwbridge_before and _link_exists(GWBRIDGE):  # the engine runs on (the session's): ours to remove
            subprocess.run(["ip", "link", "delete", GWBRIDGE], capture_output=True, timeout=10)
    assert gwbridge_before or not _link_exists(GWBRIDGE), f"{GWBRIDGE} was left behind"


def _swarm_run(swarm: Swarm, stack: str, *args: str) -> subprocess.CompletedProcess:
    """`kvtransit swarm run` as a user runs it, from the repository."""
    return subprocess.run([sys.executable, "-m", "kvtransit.cli", "swarm", "run", "--stack", stack, *args],
                          cwd=ROOT, env=swarm.env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S * 2)


def _stacks(swarm: Swarm) -> list[str]:
    return subprocess.run(["docker", "stack", "ls", "--format", "{{.Name}}"], env=swarm.env, capture_output=True,
                          text=True, timeout=60).stdout.split()


def _nothing_of(swarm: Swarm, stack: str) -> None:
    """The stack, its networks and every container are gone."""
    listed = run(["docker", "network", "ls", "--format", "{{.Name}}"], swarm.env).split()
    assert not set(network_names(stack)) & set(listed), listed
    assert run(["docker", "ps", "-a", "-q"], swarm.env).split() == []
    assert stack not in _stacks(swarm)


def test_the_stack_runs_a_shaped_scenario_on_a_swarm_accounting_for_every_request(swarm, tmp_path):
    stack = f"kvtransit{secrets.token_hex(3)}"
    runs = tmp_path / "runs"
    port = int(swarm.env["KVTRANSIT_PROMETHEUS_PORT"])
    try:
        # --no-remove: the stack stays up so its Prometheus can be asked; removed below as the helper removes it.
        done = _swarm_run(swarm, stack, "--runs-dir", str(runs), "--no-remove", "--json", *SCENARIO)
        assert done.returncode == 0, f"kvtransit swarm run exited {done.returncode}:\n{done.stderr[-4000:]}"
        summary = json.loads(done.stdout)

        # Every request accounted for: ok, slo-miss, or failed with a reason.
        requests = json.loads((runs / "report.json").read_text())["requests"]
        assert requests["total"] == 12, requests
        assert requests["ok"] + requests["slo_miss"] + requests["failed"] + requests["timed_out"] == 12, requests
        assert sum(requests["failed_reasons"].values()) == requests["failed"], requests
        assert "" not in requests["failed_reasons"], requests
        # The ledger passes the checks a chaos run is judged by (nothing lost, duplicated, cross-delivered or
        # corrupted; the counters agree), and the helper's verdict is the same.
        verdict = ledger_check.read(runs / "report.run" / "ledger.jsonl")
        assert verdict.ok, verdict.problems()
        assert verdict.requests == 12
        assert summary["ledger"]["passed"] and summary["ledger"]["requests"] == 12

        # Each service was placed by its label on the one node, and the load generator ran once, to the end.
        assert {name: service["node"] for name, service in summary["services"].items()} == \
            dict.fromkeys(PLACEMENT, swarm.hostname)
        assert summary["services"]["loadgen"] == {"node": swarm.hostname, "tasks": 1, "state": "Complete"}
        # tc shaped the middlebox's egress towards decode inside its container (NET_ADMIN reached the service).
        assert summary["link_shaper"].startswith("kvtransit shaped ") and " tbf " in summary["link_shaper"], \
            summary["link_shaper"]

        # The stack's Prometheus reached every agent by name over the overlay network.
        assert agents_scraped(f"http://127.0.0.1:{port}", AGENTS) == dict.fromkeys(AGENTS, 1.0)

        # What the helper runs after every run without --no-remove: the stack, its networks, its containers.
        remove_stack(stack, swarm.env)
        _nothing_of(swarm, stack)
    finally:
        if stack in _stacks(swarm):
            remove_stack(stack, swarm.env)  # a failed run: the same removal, networks waited for


def test_a_service_that_cannot_start_fails_the_run_in_one_line_naming_it_and_the_stack_is_removed(swarm, tmp_path):
    stack = f"kvtransit{secrets.token_hex(3)}"
    # An override whose decode exits at once (its parser refuses the flag): never healthy.
    broken = tmp_path / "broken-decode.yml"
    broken.write_text('version: "3.8"\nservices:\n  decode:\n    command: ["kvtransit", "decode", "--no-such-flag"]\n')
    try:
        done = _swarm_run(swarm, stack, "-c", "docker-stack.yml", "-c", str(broken), "--ready-timeout", "15",
                          "--runs-dir", str(tmp_path / "runs"), *SCENARIO)
        assert done.returncode == 1, done.stdout + done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("kvtransit swarm: error: ")]
        assert len(errors) == 1, done.stderr
        assert errors[0].startswith(f"kvtransit swarm: error: stack {stack} not healthy in 15 s: decode "), errors[0]
        assert "unrecognized arguments: --no-such-flag" in errors[0], errors[0]
        assert not (tmp_path / "runs" / "report.json").exists()
        _nothing_of(swarm, stack)  # removed on failure too, networks waited for
    finally:
        if stack in _stacks(swarm):
            remove_stack(stack, swarm.env)
