"""Where the testbed's pods may run: pod anti-affinity so that roles land on different nodes, node selectors, and
the check that a scenario can be placed on the cluster's nodes at all.

The unit of placement is the node group: a role's pods, plus what runs with a role (a flow's role beside a core one,
as `kvtransit up` places it: the tier's KV pool beside the middlebox, which reaches the pool on its own host, the pool
link's time the middlebox's to model, not a real NIC's; harness/deploy/flow_deploy.py: `ExtraRole.runs_with`). Pods of
different groups never share a node (required anti-affinity, or preferred with `--preferred-affinity`), so every hop
between roles crosses a real NIC and each agent's step holds get a host's CPUs; pods of one group spread over nodes when
there are enough (preferred). Instances of a role may share a node, so the nodes needed are the groups, not the pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvtransit.harness.deploy.k8s.naming import COMPONENT, HOSTNAME_TOPOLOGY, INSTANCE, NODE_GROUP, ROLE_NODE_LABEL
from kvtransit.model.errors import ConfigError

# `runs_with`: role → the role whose node it shares (a flow's role: harness/deploy/flow_deploy.py); the core's roles
# each have their own group.
RunsWith = Mapping[str, str]
# Scheduler weights (1..100): keeping groups apart outranks spreading one role's instances.
APART_WEIGHT = 100
SPREAD_WEIGHT = 50


def node_group(role: str, runs_with: RunsWith | None = None) -> str:
    return (runs_with or {}).get(role, role)


def groups(roles: Sequence[str], runs_with: RunsWith | None = None) -> list[str]:
    """The node groups of these roles, in order, each once."""
    return list(dict.fromkeys(node_group(role, runs_with) for role in roles))


def check_nodes(roles: Sequence[str], nodes: int | None, *, preferred: bool, runs_with: RunsWith | None = None) -> None:
    """Refuse a placement that required anti-affinity cannot satisfy on `nodes` nodes (None: not known, not
    checked), offering the preferred variant."""
    if nodes is None or preferred:
        return
    if nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, got {nodes}")
    needed = groups(roles, runs_with)
    if nodes < len(needed):
        raise ConfigError(f"--nodes {nodes}: this scenario needs {len(needed)} nodes with required anti-affinity "
                          f"({', '.join(needed)} each on nodes of their own); give a cluster of at least "
                          f"{len(needed)} nodes, or --preferred-affinity to let roles share nodes (fidelity then "
                          "depends on the scheduler)")


def pod_affinity(instance: str, role: str, *, preferred: bool, runs_with: RunsWith | None = None) -> dict:
    """The `affinity` of a role's pods."""
    runs_with = runs_with or {}
    group = node_group(role, runs_with)
    apart = {"labelSelector": {"matchExpressions": [
        {"key": INSTANCE, "operator": "In", "values": [instance]},
        # Only the testbed's own pods (they all carry a group): a chaos Job or a reader pod of this instance may
        # go anywhere, and NotIn alone would also match a pod without the label.
        {"key": NODE_GROUP, "operator": "Exists"},
        {"key": NODE_GROUP, "operator": "NotIn", "values": [group]}]},
        "topologyKey": HOSTNAME_TOPOLOGY}
    spread = {"labelSelector": {"matchLabels": {INSTANCE: instance, COMPONENT: role}},
              "topologyKey": HOSTNAME_TOPOLOGY}
    anti: dict = {}
    preferred_terms = [{"weight": SPREAD_WEIGHT, "podAffinityTerm": spread}]
    if preferred:
        preferred_terms.insert(0, {"weight": APART_WEIGHT, "podAffinityTerm": apart})
    else:
        anti["requiredDuringSchedulingIgnoredDuringExecution"] = [apart]
    anti["preferredDuringSchedulingIgnoredDuringExecution"] = preferred_terms
    affinity: dict = {"podAntiAffinity": anti}
    if role in runs_with:  # on the very node of the role it runs with, whatever the variant
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {INSTANCE: instance, COMPONENT: runs_with[role]}},
             "topologyKey": HOSTNAME_TOPOLOGY}]}
    return affinity


def node_selector(role: str, common: Mapping[str, str], *, role_nodes: bool,
                  runs_with: RunsWith | None = None) -> dict[str, str]:
    """`common` (every pod's, e.g. nodes set aside for the testbed) plus, with `role_nodes`, the role's own node
    label: nodes labelled `kvtransit.io/role=decode` take the decode pods."""
    selector = dict(common)
    if role_nodes:
        selector[ROLE_NODE_LABEL] = node_group(role, runs_with)
    return selector


def one_per_node(match_labels: Mapping[str, str]) -> dict:
    """Required anti-affinity among the pods `match_labels` selects: each on a node of its own (the sweep's
    points, whose testbeds must not share a host's CPUs)."""
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": dict(match_labels)}, "topologyKey": HOSTNAME_TOPOLOGY}]}}
