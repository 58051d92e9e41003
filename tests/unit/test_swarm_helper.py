"""`kvtransit swarm run`'s decisions before it deploys anything: which scenarios a stack can run, whether the node
labels place every service (and the load generator here, where its report is written), what it tells the stack's
commands, and that each refusal is one line. The deploy itself is tests/system/test_swarm_stack.py's.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import pytest

from kvtransit.cli import main
from kvtransit.harness.deploy.swarm.docker_cli import DockerFailed, docker, last_line
from kvtransit.harness.deploy.swarm.errors import SwarmUnavailable
from kvtransit.harness.deploy.swarm.preflight import check_swarm
from kvtransit.harness.deploy.swarm.stack import (
    CAP_ADD_API,
    PLACEMENT,
    Node,
    api_version,
    placement_problems,
    refusal,
    stack_env,
    task_state,
)
from kvtransit.model.scenario import Scenario

ALL_LABELS = dict.fromkeys(PLACEMENT.values(), "true")
ROOT = Path(__file__).resolve().parents[2]


def _node(node_id: str, labels: dict[str, str], *, usable: bool = True) -> Node:
    return Node(id=node_id, hostname=f"host-{node_id}", usable=usable, labels=labels)


def test_one_node_carrying_every_role_label_places_the_whole_stack():
    assert placement_problems([_node("a", ALL_LABELS)], here="a") == []


def test_three_nodes_one_role_each_place_the_stack_with_the_load_generator_here():
    nodes = [_node("a", {"kvtransit.prefill": "true", "kvtransit.loadgen": "true"}),
             _node("b", {"kvtransit.middlebox": "true"}), _node("c", {"kvtransit.decode": "true"})]
    assert placement_problems(nodes, here="a") == []


def test_a_role_label_on_no_usable_node_is_named_with_the_command_that_adds_it():
    labels = {k: v for k, v in ALL_LABELS.items() if k != "kvtransit.decode"}
    nodes = [_node("a", labels), _node("b", {"kvtransit.decode": "true"}, usable=False)]  # drained: not usable
    assert placement_problems(nodes, here="a") == [
        "no ready node carries kvtransit.decode=true (docker node update --label-add kvtransit.decode=true NODE)"]


def test_the_load_generator_must_run_on_this_node_only_where_its_report_is_written():
    nodes = [_node("a", {k: v for k, v in ALL_LABELS.items() if k != "kvtransit.loadgen"}),
             _node("b", {"kvtransit.loadgen": "true"})]
    problems = placement_problems(nodes, here="a")
    assert len(problems) == 2
    assert "not on this node" in problems[0] and "--label-add kvtransit.loadgen=true host-a" in problems[0]
    assert "also on host-b" in problems[1]


def test_a_node_is_read_from_docker_node_inspect():
    entry = {"ID": "x1", "Description": {"Hostname": "vm"}, "Status": {"State": "ready"},
             "Spec": {"Availability": "active", "Role": "manager", "Labels": {"kvtransit.decode": "true"}}}
    assert Node.from_inspect(entry) == Node("x1", "vm", True, {"kvtransit.decode": "true"})
    drained = {**entry, "Spec": {"Availability": "drain", "Labels": None}}
    assert Node.from_inspect(drained).usable is False and Node.from_inspect(drained).labels == {}


def test_the_stack_runs_one_prefill_one_decode_without_the_pool_and_says_what_else_to_use():
    assert refusal(Scenario()) is None
    assert "kvtransit k8s render" in (refusal(Scenario(prefill=2, decode=2)) or "")
    assert "no KV pool" in (refusal(Scenario.build(kv_pool="pool")) or "")


def test_the_stack_is_told_the_whole_scenario_an_absolute_runs_dir_and_no_pool(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scenario = Scenario(requests=7, trace="")
    env = stack_env(scenario, Path("runs/x"))
    assert shlex.split(env["KVTRANSIT_SCENARIO"]) == scenario.to_argv()
    assert env["KVTRANSIT_RUNS_DIR"] == str(tmp_path / "runs" / "x")
    assert [env[name] for name in ("KVTRANSIT_MIDDLEBOX_POOL_FLAGS", "KVTRANSIT_PREFILL_POOL_FLAGS",
                                   "KVTRANSIT_POOL_STATS")] == ["", "", ""]


def test_swarm_states_and_api_versions_are_read_as_the_cli_prints_them():
    assert task_state("Complete 2 seconds ago") == "Complete"
    assert task_state("") == ""
    assert api_version("1.41") == CAP_ADD_API > api_version("1.40")
    assert last_line("Traceback ...\n  File x\nsocket.gaierror: [Errno -2] Name\n\n") == \
        "socket.gaierror: [Errno -2] Name"


@pytest.mark.slow  # starts a process
def test_no_docker_cli_is_said_in_one_line(tmp_path):
    with pytest.raises(SwarmUnavailable, match="docker not found on PATH"):
        docker(["info"], env={"PATH": str(tmp_path)})  # an empty folder: no docker in it


@pytest.mark.slow  # starts a process
def test_an_engine_that_does_not_answer_is_one_line_quoting_the_cli(tmp_path):
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI on PATH")
    with pytest.raises(DockerFailed, match=r"^`docker info --format \{\{json \.Swarm\}\}` exited 1: .*Cannot connect"):
        check_swarm({"PATH": os.environ["PATH"], "DOCKER_HOST": f"unix://{tmp_path}/none.sock"})


def test_the_cli_refuses_a_scenario_the_stack_cannot_run_before_touching_docker(capsys, tmp_path):
    assert main(["swarm", "run", "--kv-pool", "pool", "--runs-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvtransit swarm: error: the stack has no KV pool")
    assert not (tmp_path / "r").exists()


def test_the_cli_refuses_a_missing_stack_file_in_one_line(capsys, tmp_path):
    assert main(["swarm", "run", "-c", str(tmp_path / "nope.yml"), "--runs-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err == (f"kvtransit swarm: error: {tmp_path / 'nope.yml'}: no such stack file (run from the repository, "
                   "or give -c PATH)\n")


class _FakeDocker:
    """`docker` as a stack's removal sees it: the first `stack rm` leaves a network a stopping task still uses."""

    def __init__(self, stack: str, network: str) -> None:
        self.stack, self.network = stack, network
        self.calls: list[list[str]] = []
        self.containers = ["c0ffee"]  # the stopping task's container, gone after one look
        self.networks = [network, "bridge"]

    def __call__(self, args, *, env=None, timeout_s=0.0) -> str:
        self.calls.append(list(args))
        if args[:2] == ["stack", "rm"]:
            if sum(c[:2] == ["stack", "rm"] for c in self.calls) == 1:
                raise DockerFailed(f"`docker stack rm {self.stack}` exited 1: Failed to remove network x: Error "
                                   f"response from daemon: network x is in use by task y")
            self.networks.remove(self.network)
            return ""
        if args[:2] == ["network", "ls"]:
            return "\n".join(self.networks)
        if args[:2] == ["ps", "-a"]:
            left, self.containers = self.containers, []
            return "\n".join(left)
        raise AssertionError(args)


def test_a_network_left_in_use_by_a_stopping_task_is_removed_once_the_tasks_are_gone(monkeypatch):
    from kvtransit.harness.deploy.swarm import stack_run
    from kvtransit.harness.deploy.swarm.stack import network_names

    stack = "kvtransitabc123"
    fake = _FakeDocker(stack, network_names(stack)[0])
    monkeypatch.setattr(stack_run, "docker", fake)
    monkeypatch.setattr(stack_run, "POLL_S", 0.0)
    stack_run.remove_stack(stack, {}, timeout_s=5.0)
    removals = [c for c in fake.calls if c[:2] == ["stack", "rm"]]
    assert removals == [["stack", "rm", stack]] * 2  # by its exact name, asked again after the container went
    assert fake.network not in fake.networks and "bridge" in fake.networks


def test_any_other_removal_failure_is_raised(monkeypatch):
    from kvtransit.harness.deploy.swarm import stack_run

    def failing(args, *, env=None, timeout_s=0.0) -> str:
        raise DockerFailed("`docker stack rm s` exited 1: permission denied")

    monkeypatch.setattr(stack_run, "docker", failing)
    with pytest.raises(DockerFailed, match="permission denied"):
        stack_run.remove_stack("s", {}, timeout_s=1.0)
