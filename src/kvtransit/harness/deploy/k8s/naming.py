"""What every manifest of a kvtransit testbed agrees on: resource names, labels, container ports.

Ports are the compose testbed's (docker-compose.yml), so a pod and a container run the very same command line:
9000 ingress, 9001 decode's client port, 9100 /metrics, 9200 the middlebox's control API (a flow's own ports are its
deploy face's: the tier's pool port, 9300).
"""

from __future__ import annotations

from dataclasses import dataclass

INGRESS_PORT = 9000
CLIENT_PORT = 9001  # decode: where the load generator reads the tokens
METRICS_PORT = 9100
CONTROL_PORT = 9200  # middlebox: the live control API (/chain, /kernel, /link, /faults/NAME)
# The compose file's image (docker-compose.yml: kvtransit:${KVTRANSIT_IMAGE_TAG:-local}).
DEFAULT_IMAGE = "kvtransit:local"
DEFAULT_NAME = "kvtransit"
DEFAULT_NAMESPACE = "kvtransit"
# The testbed's core roles, in the order the launcher starts them (harness/up/launcher.py); a flow's roles go
# among them (harness/deploy/flow_deploy.py: `ExtraRole.after`).
ROLES = ("decode", "middlebox", "prefill", "loadgen")

# Recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/common-labels).
PART_OF = "app.kubernetes.io/part-of"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
NAME_LABEL = "app.kubernetes.io/name"
MANAGED_BY = "app.kubernetes.io/managed-by"
# Which pods may share a node: a role's pods and what runs with it (the KV pool beside the middlebox).
NODE_GROUP = "kvtransit.io/node-group"
# The node label `--role-nodes` selects on (`kubectl label node N kvtransit.io/role=decode`). (The Swarm stack uses
# one boolean label a role, `kvtransit.decode=true`, so one node may carry all: harness/deploy/swarm/stack.py.)
ROLE_NODE_LABEL = "kvtransit.io/role"
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
# The pod's own name, from the downward API, given to the agent as its --name.
POD_NAME_ENV = "POD_NAME"
# The middlebox's control API token (`kvtransit middlebox --control-token-env`, the default variable): read from
# an optional Secret, so a cluster that makes one gets an API that refuses everyone else.
CONTROL_TOKEN_ENV = "KVTRANSIT_CONTROL_TOKEN"  # noqa: S105 - the variable's name, not a token
CONTROL_TOKEN_KEY = "token"  # noqa: S105 - the Secret's key name, not a token


@dataclass(frozen=True)
class Names:
    """The resource names of one testbed instance (`--name`, default kvtransit)."""

    instance: str = DEFAULT_NAME

    def of(self, role: str) -> str:
        """The workload and Service of a role: kvtransit-decode."""
        return f"{self.instance}-{role}"

    def pod_host(self, role: str, index: int) -> str:
        """A StatefulSet pod through its headless Service: kvtransit-decode-0.kvtransit-decode (the namespace's
        search path completes the name)."""
        return f"{self.of(role)}-{index}.{self.of(role)}"

    def pod_address(self, role: str, index: int, port: int) -> str:
        return f"{self.pod_host(role, index)}:{port}"

    def service_address(self, role: str, port: int) -> str:
        return f"{self.of(role)}:{port}"

    @property
    def scenario_configmap(self) -> str:
        return f"{self.instance}-scenario"

    @property
    def control_secret(self) -> str:
        return f"{self.instance}-control"

    @property
    def runs_claim(self) -> str:
        return f"{self.instance}-runs"

    def labels(self, role: str) -> dict[str, str]:
        return {NAME_LABEL: "kvtransit", INSTANCE: self.instance, COMPONENT: role, PART_OF: "kvtransit",
                MANAGED_BY: "kvtransit"}

    def selector(self, role: str) -> dict[str, str]:
        """What a workload's selector and its Service match on (stable: never a label that may change)."""
        return {INSTANCE: self.instance, COMPONENT: role}
