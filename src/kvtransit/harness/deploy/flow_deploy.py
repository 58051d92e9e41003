"""What a flow needs of the testbed beyond one host (a flow's `deploy.py`: DEPLOY): the compose testbed
(docker-compose.yml, its .env from docker/scenario_env.py), the Docker Swarm stack (docker-stack.yml) and the
Kubernetes manifests (harness/deploy/k8s/).

A flow either cannot run on a target yet (`refuse`: one line saying why and what runs it instead), or runs roles of
its own there (`roles`: each beside a core role, started after another) with the flags and ports it adds to the core
roles and its own (`flags`, `ports`), and, for compose, the .env lines that turn it on (`compose_env`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvtransit.model.scenario import Scenario

TARGETS = ("compose", "swarm", "k8s")
# address(role, port name) → where that role's named port is reached on the target ("kvpool:9000", a Service's).
Address = Callable[[str, str], str]


@dataclass(frozen=True)
class ExtraRole:
    name: str
    runs_with: str  # the core role whose node (namespace, host) it shares
    after: str  # started once every instance of this core role is up (the launcher's order)


class FlowDeploy:
    def refuse(self, scenario: Scenario, target: str, what: str) -> str | None:
        """Why `target` (`what` names it in the message: "the k8s testbed", "a sweep rendered for k8s") cannot carry
        this flow yet (None: it can)."""
        return None

    def roles(self, scenario: Scenario, target: str) -> list[ExtraRole]:
        return []

    def flags(self, scenario: Scenario, target: str, role: str, address: Address, listen: Callable[[str], str]) -> (
            list[str]):
        """Flags it adds to `role`'s command (a core role's, or its own beside its listen and metrics flags);
        `listen(port name)` is where that role listens for a named port on the target ("0.0.0.0:9300")."""
        return []

    def ports(self, scenario: Scenario, target: str, role: str) -> dict[str, int]:
        """Named ports it opens on `role` (a core role's, or its own besides ingress and metrics)."""
        return {}

    def compose_env(self, scenario: Scenario) -> dict[str, str]:
        return {}


def flow_deploys(scenario: Scenario) -> list[FlowDeploy]:
    """The DEPLOY of every flow `scenario` turns on, in registry order."""
    from kvtransit import flows  # the registry only: the core reaches a flow through it, by a string

    enabled = set(scenario.flows)
    return [deploy for name, deploy in flows.attribute("deploy", "DEPLOY") if name in enabled]


def refusal(scenario: Scenario, target: str, what: str) -> str | None:
    """The first enabled flow's refusal of `target`, or None."""
    return next((why for deploy in flow_deploys(scenario) if (why := deploy.refuse(scenario, target, what))), None)


def extra_roles(scenario: Scenario, target: str) -> list[ExtraRole]:
    return [role for deploy in flow_deploys(scenario) for role in deploy.roles(scenario, target)]
