"""The testbed on Kubernetes, as plain dicts: one workload per role, its Service, the scenario ConfigMap.

The same processes as the compose testbed (docker-compose.yml) and `kvtransit up`, with the same flags and ports:

    loadgen (Job) ──▶ prefill (StatefulSet) ──▶ middlebox (Deployment, tc on its egress) ══▶ decode (StatefulSet)

- prefill and decode are StatefulSets behind headless Services: the load generator names every prefill and decode
  instance (`--prefill`, `--decode-clients`) and the middlebox every decode (`--decode`), so each pod needs a
  stable address of its own (kvtransit-decode-0.kvtransit-decode:9000). The middlebox (one per run, as in the
  launcher) and the KV pool are Deployments behind ClusterIP Services; the load generator is a Job (a run ends).
- The middlebox shapes its egress with tc as in compose (NET_ADMIN, docker/entrypoint.sh's KVTRANSIT_SHAPE_TO,
  `--link-backend tc` for it and decode), or leaves the rate to its own token bucket with `link_shaper="userspace"`
  (what Chaos Mesh's tc faults need: chaos-daemon deletes every root qdisc of a pod it shapes, the testbed's tbf
  too, and does not put it back; docs/scale.md).
- Pods carry Prometheus' scrape annotations; placement (anti-affinity, node selectors) is `placement.py`'s.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvtransit.harness.deploy.flow_deploy import extra_roles, flow_deploys
from kvtransit.harness.deploy.k8s.naming import (
    CLIENT_PORT,
    CONTROL_PORT,
    CONTROL_TOKEN_ENV,
    CONTROL_TOKEN_KEY,
    DEFAULT_IMAGE,
    DEFAULT_NAME,
    DEFAULT_NAMESPACE,
    INGRESS_PORT,
    METRICS_PORT,
    NODE_GROUP,
    POD_NAME_ENV,
    ROLES,
    Names,
)
from kvtransit.harness.deploy.k8s.placement import check_nodes, node_group, node_selector, pod_affinity
from kvtransit.harness.deploy.k8s.scenario_configmap import (
    refuse_host_files,
    scenario_args,
    scenario_configmap,
    scenario_env_from,
)
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

LINK_SHAPERS = ("tc", "userspace")
ANY_ADDRESS = "0.0.0.0"  # noqa: S104 - a pod's agent listens on its pod IP; the pod is the boundary
RUNS_DIR = "/runs"
REPORT_PATH = f"{RUNS_DIR}/report.json"
# How long the load generator's init container waits for every peer's /metrics before the Job fails: image pulls
# and a crash-looping middlebox waiting for decode take minutes on a cold cluster (a guess with room; the Job can
# be re-created).
PEERS_READY_TIMEOUT_S = 600
# The compose healthcheck's probe (docker-compose.yml: /metrics answers once the agent is up).
READINESS_PROBE = {"httpGet": {"path": "/metrics", "port": "metrics"}, "periodSeconds": 2, "failureThreshold": 3}
WAIT_FOR_PEERS = """\
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
for url in sys.argv[2:]:
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"{url}: not ready after {sys.argv[1]} s ({exc})")
            time.sleep(1)
"""


TARGET = "k8s"  # the flows' name for this target (harness/deploy/flow_deploy.py)


@dataclass(frozen=True)
class TestbedOptions:
    """How a scenario is put on a cluster (`kvtransit k8s render`'s flags beside the scenario's)."""

    __test__ = False  # not a pytest class, whatever its name

    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    image: str = DEFAULT_IMAGE
    nodes: int | None = None  # the cluster's nodes, when known: checked against required anti-affinity
    preferred_affinity: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)
    role_nodes: bool = False
    link_shaper: str = "tc"
    runs_storage: str = "1Gi"

    def __post_init__(self) -> None:
        if self.link_shaper not in LINK_SHAPERS:
            raise ConfigError(f"--link-shaper: unknown value {self.link_shaper!r} (choose from: "
                              f"{', '.join(LINK_SHAPERS)})")
        for what, value in (("--name", self.name), ("--namespace", self.namespace)):
            if not _dns_label(value):
                raise ConfigError(f"{what} {value!r}: must be a DNS label (lower-case letters, digits and '-', "
                                  "starting with a letter, at most 40 characters here so resource names fit)")


def _dns_label(text: str) -> bool:
    return (0 < len(text) <= 40 and text[0].isalpha() and text[-1].isalnum()
            and all(c.islower() or c.isdigit() or c == "-" for c in text))


def roles(scenario: Scenario) -> list[str]:
    """The roles this scenario runs, in the launcher's start order: the core's, each flow's role after the core role
    it follows (harness/deploy/flow_deploy.py: the tier's KV pool after the decodes)."""
    extra = extra_roles(scenario, TARGET)
    out: list[str] = []
    for role in ROLES:
        out.append(role)
        out += [r.name for r in extra if r.after == role]
    return out


def render_testbed(scenario: Scenario, options: TestbedOptions) -> dict[str, list[dict]]:
    """File name (without its directory) → the manifests it holds. Raises ConfigError on a scenario that cannot
    run in pods or cannot be placed on `options.nodes` nodes."""
    refuse_host_files(scenario, "the k8s testbed")
    present = roles(scenario)
    runs_with = {r.name: r.runs_with for r in extra_roles(scenario, TARGET)}
    check_nodes(present, options.nodes, preferred=options.preferred_affinity, runs_with=runs_with)
    names = Names(options.name)
    builder = _Builder(scenario, options, names, present)
    parts: dict[str, list[dict]] = {
        "namespace.yaml": [{"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": options.namespace, "labels": names.labels("testbed")}}],
        "scenario.yaml": [scenario_configmap(scenario, names.scenario_configmap, names.labels("scenario"))],
    }
    for role in present:
        parts[f"{role}.yaml"] = builder.role(role)
    return parts


class _Builder:
    def __init__(self, scenario: Scenario, options: TestbedOptions, names: Names, present: list[str]):
        self.scenario, self.options, self.names, self.present = scenario, options, names, present
        self.extra = {r.name: r for r in extra_roles(scenario, TARGET)}  # the flows' roles
        self.runs_with = {name: r.runs_with for name, r in self.extra.items()}
        self.deploys = flow_deploys(scenario)

    # --- addresses --------------------------------------------------------------------------------------------
    def _each(self, role: str, count: int, port: int) -> str:
        return ",".join(self.names.pod_address(role, i, port) for i in range(count))

    def _metrics_addresses(self) -> str:
        """Every peer's /stats for the load generator's report, in the launcher's order."""
        counts = {"decode": self.scenario.decode, "prefill": self.scenario.prefill}
        return ",".join(self._each(role, counts[role], METRICS_PORT) if role in counts
                        else self.names.service_address(role, METRICS_PORT)
                        for role in self.present if role != "loadgen")

    def _named_ports(self, role: str) -> dict[str, int]:
        """The ports a role opens, by name: the core's, and what the flows add to it."""
        ports = {} if role == "loadgen" else {"ingress": INGRESS_PORT}
        if role == "decode":
            ports["client"] = CLIENT_PORT
        if role == "middlebox":
            ports["control"] = CONTROL_PORT
        for deploy in self.deploys:
            ports.update(deploy.ports(self.scenario, TARGET, role))
        return ports

    def _flow_flags(self, role: str) -> list[str]:
        """What the flows add to a role's command: their wiring, at the Services' addresses."""
        def address(target_role: str, port: str) -> str:
            return self.names.service_address(target_role, self._named_ports(target_role)[port])

        def listen(port: str) -> str:
            return f"{ANY_ADDRESS}:{self._named_ports(role)[port]}"

        return [flag for deploy in self.deploys for flag in deploy.flags(self.scenario, TARGET, role, address, listen)]

    # --- each role ---------------------------------------------------------------------------------------------
    def role(self, role: str) -> list[dict]:
        if role in self.extra:  # a flow's role: one per run, behind a ClusterIP Service (the tier's KV pool)
            return [self.deployment(role), self.service(role, headless=False)]
        return getattr(self, f"_{role}")()

    def _own_flags(self, role: str) -> list[str]:
        listen = f"{ANY_ADDRESS}:{INGRESS_PORT}"
        metrics = ["--metrics-listen", f"{ANY_ADDRESS}:{METRICS_PORT}", "--name", f"$({POD_NAME_ENV})"]
        tc = ["--link-backend", "tc"] if self.options.link_shaper == "tc" else []
        if role == "decode":
            return ["--listen", listen, "--client-listen", f"{ANY_ADDRESS}:{CLIENT_PORT}", *metrics, *tc]
        if role == "middlebox":
            return ["--listen", listen, "--decode", self._each("decode", self.scenario.decode, INGRESS_PORT),
                    "--control-listen", f"{ANY_ADDRESS}:{CONTROL_PORT}", *metrics, *tc, *self._flow_flags(role)]
        if role == "prefill":
            return ["--listen", listen, "--kv-to", self.names.service_address("middlebox", INGRESS_PORT), *metrics,
                    *self._flow_flags(role)]
        if role in self.extra:
            return ["--listen", listen, *metrics, *self._flow_flags(role)]
        assert role == "loadgen", role
        return ["--prefill", self._each("prefill", self.scenario.prefill, INGRESS_PORT),
                "--decode-clients", self._each("decode", self.scenario.decode, CLIENT_PORT),
                "--stats", self._metrics_addresses(), "--report", REPORT_PATH, *metrics]

    def _ports(self, role: str) -> list[dict]:
        return [*({"name": name, "containerPort": port} for name, port in self._named_ports(role).items()),
                {"name": "metrics", "containerPort": METRICS_PORT}]

    def container(self, role: str) -> dict:
        env: list[dict] = [{"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        security: dict = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        if role == "middlebox":
            env.append({"name": CONTROL_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
                "name": self.names.control_secret, "key": CONTROL_TOKEN_KEY, "optional": True}}})
            if self.options.link_shaper == "tc":
                # docker/entrypoint.sh shapes the egress towards this host (the scenario's scaled link) before
                # the agent starts: every decode is reached through the pod's one interface, so one tbf is the
                # scenario's one shared link (docs/reference.md §4).
                env.append({"name": "KVTRANSIT_SHAPE_TO", "value": self.names.pod_host("decode", 0)})
                security["capabilities"]["add"] = ["NET_ADMIN"]
        container: dict = {
            "name": role, "image": self.options.image, "imagePullPolicy": "IfNotPresent",
            "args": ["kvtransit", role, *scenario_args(), *self._own_flags(role)],
            "env": env, "envFrom": scenario_env_from(self.names.scenario_configmap),
            "ports": self._ports(role), "readinessProbe": READINESS_PROBE, "securityContext": security,
        }
        if role == "loadgen":
            container["volumeMounts"] = [{"name": "runs", "mountPath": RUNS_DIR}]
        return container

    def pod_template(self, role: str, spec_extra: dict | None = None) -> dict:
        labels = {**self.names.labels(role), NODE_GROUP: node_group(role, self.runs_with)}
        spec: dict = {
            "enableServiceLinks": False,  # no *_SERVICE_HOST variables beside the scenario's
            "affinity": pod_affinity(self.options.name, role, preferred=self.options.preferred_affinity,
                                     runs_with=self.runs_with),
        }
        selector = node_selector(role, self.options.node_selector, role_nodes=self.options.role_nodes,
                                 runs_with=self.runs_with)
        if selector:
            spec["nodeSelector"] = selector
        spec.update(spec_extra or {})
        spec["containers"] = [self.container(role)]
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                       "prometheus.io/path": "/metrics"}
        return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}

    def service(self, role: str, *, headless: bool) -> dict:
        ports = [{"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]} for p in self._ports(role)]
        spec: dict = {"selector": self.names.selector(role), "ports": ports}
        if headless:
            # Per-pod DNS names from the moment a pod has an address: the peers' dial loops retry until it serves.
            spec.update({"clusterIP": "None", "publishNotReadyAddresses": True})
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": self.names.of(role), "labels": self.names.labels(role)}, "spec": spec}

    def stateful_set(self, role: str, replicas: int) -> dict:
        return {"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": self.names.of(role), "labels": self.names.labels(role)},
                "spec": {"serviceName": self.names.of(role), "replicas": replicas,
                         "podManagementPolicy": "Parallel",  # instances start together, as the launcher's do
                         "selector": {"matchLabels": self.names.selector(role)},
                         "template": self.pod_template(role)}}

    def deployment(self, role: str) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": self.names.of(role), "labels": self.names.labels(role)},
                # One per run, never two at once (a rolling update would run two middleboxes on one link).
                "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                         "selector": {"matchLabels": self.names.selector(role)},
                         "template": self.pod_template(role)}}

    def _decode(self) -> list[dict]:
        return [self.stateful_set("decode", self.scenario.decode), self.service("decode", headless=True)]

    def _prefill(self) -> list[dict]:
        return [self.stateful_set("prefill", self.scenario.prefill), self.service("prefill", headless=True)]

    def _middlebox(self) -> list[dict]:
        return [self.deployment("middlebox"), self.service("middlebox", headless=False)]

    def _loadgen(self) -> list[dict]:
        peers = [f"http://{address}/metrics" for address in self._metrics_addresses().split(",")]
        wait = {"name": "wait-for-peers", "image": self.options.image, "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", WAIT_FOR_PEERS, str(PEERS_READY_TIMEOUT_S), *peers],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
        template = self.pod_template("loadgen", {
            "restartPolicy": "Never", "initContainers": [wait],
            "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": self.names.runs_claim}}]})
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": self.names.of("loadgen"), "labels": self.names.labels("loadgen")},
               # A run is not retried behind the user's back: a second run would append to the same ledger.
               "spec": {"backoffLimit": 0, "template": template}}
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": self.names.runs_claim, "labels": self.names.labels("loadgen")},
                 "spec": {"accessModes": ["ReadWriteOnce"],
                          "resources": {"requests": {"storage": self.options.runs_storage}}}}
        return [claim, job, self.service("loadgen", headless=True)]


def runs_reader(options: TestbedOptions) -> dict:
    """A pod that mounts the runs volume once the load generator's Job is done, to copy the report and the ledger
    out (`kubectl cp NAME-runs-reader:/runs ./runs`). Written beside the base, not part of it."""
    names = Names(options.name)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{options.name}-runs-reader",
                         "labels": {**names.labels("runs-reader"), NODE_GROUP: node_group("loadgen")}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "reader", "image": options.image, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sleep", "3600"],
                                     "volumeMounts": [{"name": "runs", "mountPath": RUNS_DIR, "readOnly": True}],
                                     "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}],
                     "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": names.runs_claim}}]}}
