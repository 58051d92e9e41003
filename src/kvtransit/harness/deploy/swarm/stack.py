"""What `kvtransit swarm` knows of docker-stack.yml: its services, the node label that places each, its networks, and
the variables its commands read. Pure; tests/unit/test_stack_files.py holds every name here to the file.

The helper does not parse the stack file (the runtime has no YAML library, and `docker stack deploy` is the one
reader that counts): it deploys the files it is given and drives the services by these names.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvtransit.harness.deploy import flow_deploy
from kvtransit.model.scenario import Scenario

DEFAULT_STACK_FILE = Path("docker-stack.yml")
DEFAULT_STACK_NAME = "kvtransit"
# Each service and the node label that places it (`node.labels.LABEL == true`). One boolean label per role, so a node
# may carry several (a single-node swarm carries all). The load generator and Prometheus share one: they bind-mount
# runs/ and prometheus/ from the checkout on the node they run on, which is where `kvtransit swarm run` reads the
# report.
PLACEMENT: dict[str, str] = {
    "decode": "kvtransit.decode",
    "middlebox": "kvtransit.middlebox",
    "prefill": "kvtransit.prefill",
    "loadgen": "kvtransit.loadgen",
    "prometheus": "kvtransit.loadgen",
}
# Deployed at 0 replicas and scaled to 1 once the others are healthy: it dials its peers once at start, and a stack
# has no depends_on. It runs once (no restart).
CLIENT = "loadgen"
SERVING = tuple(service for service in PLACEMENT if service != CLIENT)
NETWORKS = ("front", "kvlink")
# The label swarm puts on everything of a stack (services, tasks' containers, networks), valued the stack's name.
NAMESPACE_LABEL = "com.docker.stack.namespace"
# What docker/shape_egress.py prints once tc shapes the middlebox's egress towards decode (docker/entrypoint.sh).
SHAPED_MARK = "kvtransit shaped "
# The load generator's `--report /runs/report.json`, /runs mounted from KVTRANSIT_RUNS_DIR; the ledger beside it
# (REPORT.run/ledger.jsonl, cli/_agent.py).
REPORT_NAME = "report.json"
LEDGER_PATH = Path("report.run") / "ledger.jsonl"
# What the helper writes beside the report: where each service ran, how long each phase took, the ledger's verdict.
SUMMARY_NAME = "swarm.json"
# `cap_add` reaches a swarm service's containers from API 1.41 (Docker 20.10) on (ContainerSpec.CapabilityAdd);
# an older engine drops it without a word and the middlebox's tc would fail with "Operation not permitted".
CAP_ADD_API = (1, 41)


def constraint(label: str) -> str:
    """A service's placement constraint in docker-stack.yml."""
    return f"node.labels.{label} == true"


def label_command(label: str, node: str = "NODE") -> str:
    return f"docker node update --label-add {label}=true {node}"


def service_name(stack: str, service: str) -> str:
    return f"{stack}_{service}"


def network_names(stack: str) -> list[str]:
    """The stack's networks as swarm names them: exactly these, nothing matched by pattern."""
    return [f"{stack}_{network}" for network in NETWORKS]


def refusal(scenario: Scenario) -> str | None:
    """Why docker-stack.yml cannot run this scenario as it is (None: it can)."""
    if why := flow_deploy.refusal(scenario, "swarm", "docker-stack.yml"):  # a flow the stack does not carry
        return why
    if (scenario.prefill, scenario.decode) != (1, 1):
        return (f"docker-stack.yml runs one prefill and one decode, as docker-compose.yml does: "
                f"{scenario.prefill}P{scenario.decode}D needs `kvtransit up` or `kvtransit k8s render`")
    return None


def stack_env(scenario: Scenario, runs_dir: Path) -> dict[str, str]:
    """The variables docker-stack.yml's commands read, for this run. A stack does not read .env, so every one is
    given, the pool's empty (no pool in a stack) whatever the caller's shell holds."""
    return {
        # Every field spelled out, as .env holds it (docker/scenario_env.py): the CLI splits the interpolated
        # command as a shell would, so `--trace ''` stays a word.
        "KVTRANSIT_SCENARIO": shlex.join(scenario.to_argv()),
        # Absolute: the CLI resolves a relative bind source against the stack file's folder, not the caller's.
        "KVTRANSIT_RUNS_DIR": str(runs_dir.resolve()),
        "KVTRANSIT_MIDDLEBOX_POOL_FLAGS": "",
        "KVTRANSIT_PREFILL_POOL_FLAGS": "",
        "KVTRANSIT_POOL_STATS": "",
    }


@dataclass(frozen=True)
class Node:
    """A swarm node as `docker node inspect` describes it."""

    id: str
    hostname: str
    usable: bool  # Ready and Active: the scheduler may place a task on it
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_inspect(cls, entry: Mapping) -> Node:
        spec, status = entry.get("Spec") or {}, entry.get("Status") or {}
        return cls(id=entry["ID"], hostname=(entry.get("Description") or {}).get("Hostname", entry["ID"]),
                   usable=status.get("State") == "ready" and spec.get("Availability") == "active",
                   labels=dict(spec.get("Labels") or {}))


def placement_problems(nodes: Sequence[Node], here: str) -> list[str]:
    """What keeps the stack's placement constraints from holding, one line each (empty: they hold). `here` is this
    engine's node id: the load generator must run on it, since its report is written to a folder here."""
    problems = []
    this = next((node.hostname for node in nodes if node.id == here), here)
    for label in sorted(set(PLACEMENT.values())):
        carriers = [node for node in nodes if node.usable and node.labels.get(label) == "true"]
        if label == PLACEMENT[CLIENT]:
            others = [node.hostname for node in carriers if node.id != here]
            if here not in {node.id for node in carriers}:
                problems.append(f"{label}=true is not on this node, where the load generator writes the report "
                                f"({label_command(label, this)})")
            if others:
                problems.append(f"{label}=true is also on {', '.join(others)}: the load generator must run on this "
                                f"node, where the report is written (docker node update --label-rm {label} NODE)")
        elif not carriers:
            problems.append(f"no ready node carries {label}=true ({label_command(label)})")
    return problems


def api_version(text: str) -> tuple[int, int]:
    """`1.41` → (1, 41)."""
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def task_state(current_state: str) -> str:
    """The state word of `docker service ps`'s CurrentState ("Complete 2 seconds ago" → "Complete")."""
    return current_state.split(" ", 1)[0] if current_state else ""


# Task states after which nothing more happens to a task (moby's api/types/swarm TaskState, capitalised as the CLI
# prints them); "Complete" is the only good one.
TASK_DONE = "Complete"
TASK_ENDED_BADLY = frozenset({"Failed", "Rejected", "Shutdown", "Orphaned", "Remove"})
