"""Whether this engine can run docker-stack.yml, checked before anything is deployed: a swarm manager, an engine
that gives the middlebox NET_ADMIN (cap_add), and node labels that place every service.

The answer is one line, with the command that fixes it (`SwarmUnavailable`, printed by the CLI without a
traceback).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from kvtransit.harness.deploy.swarm.docker_cli import docker
from kvtransit.harness.deploy.swarm.errors import SwarmUnavailable
from kvtransit.harness.deploy.swarm.stack import CAP_ADD_API, Node, api_version, placement_problems


@dataclass(frozen=True)
class SwarmFacts:
    node_id: str  # this engine's node
    api: str  # the engine's API version
    nodes: tuple[Node, ...]

    def hostname(self, node_id: str) -> str:
        return next((node.hostname for node in self.nodes if node.id == node_id), node_id)


def check_swarm(env: Mapping[str, str]) -> SwarmFacts:
    swarm = json.loads(docker(["info", "--format", "{{json .Swarm}}"], env=env))
    if swarm.get("LocalNodeState") != "active":
        raise SwarmUnavailable("this Docker engine is not in a swarm (docker swarm init --advertise-addr ADDRESS; "
                               "deploy/swarm/README.md)")
    if not swarm.get("ControlAvailable"):
        raise SwarmUnavailable("this Docker engine is a swarm worker: deploy the stack from a manager")
    api = docker(["version", "--format", "{{.Server.APIVersion}}"], env=env).strip()
    if api_version(api) < CAP_ADD_API:
        # No user-space fallback here: a stack that cannot shape with tc would run a different link than compose
        # does; `kvtransit up` (tc in namespaces, or its user-space shaper on loopback) is the way on such a host.
        raise SwarmUnavailable(f"this engine speaks API {api}: swarm services get cap_add (the middlebox's "
                               f"NET_ADMIN for tc) from API {CAP_ADD_API[0]}.{CAP_ADD_API[1]} (Docker 20.10) on")
    ids = docker(["node", "ls", "--format", "{{.ID}}"], env=env).split()
    nodes = tuple(Node.from_inspect(entry) for entry in json.loads(docker(["node", "inspect", *ids], env=env)))
    facts = SwarmFacts(node_id=swarm["NodeID"], api=api, nodes=nodes)
    problems = placement_problems(nodes, facts.node_id)
    if problems:
        raise SwarmUnavailable("the stack cannot be placed: " + "; ".join(problems))
    return facts
