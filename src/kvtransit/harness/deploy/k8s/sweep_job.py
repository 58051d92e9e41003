"""A sweep as one Kubernetes Indexed Job: one point per completion index, each pod on a node of its own.

The points (key and scenario, in the order a local sweep runs them) travel in a ConfigMap; the pod whose
JOB_COMPLETION_INDEX is i runs point i as `kvtransit sweep --run-point` does: one whole testbed in the pod (the
launcher, `--links` as given), then prints its results row between markers on its log (sweep_logs.py).
`kvtransit sweep --collect` gathers those logs into the results file a local sweep writes.

Why the log and not a shared volume: a log needs nothing from the cluster but `kubectl logs` (a volume every pod
can write needs ReadWriteMany storage, which many clusters lack), outlives the pod until the Job is deleted, and
keeps one writer on results.json (the collector) instead of many pods racing on it. A row and its report are tens
of kilobytes, well within a container log's rotation size (10 MiB by default).
Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvtransit.harness.deploy.k8s.naming import DEFAULT_IMAGE, DEFAULT_NAME, Names
from kvtransit.harness.deploy.k8s.placement import one_per_node
from kvtransit.harness.deploy.k8s.scenario_configmap import refuse_host_files, scenario_data, scenario_from_data
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

POINTS_FILE = "points.json"
POINTS_MOUNT = "/etc/kvtransit/sweep"
# Where the pod's run writes its report (an emptyDir): the collector rewrites the rows' report paths from it.
POD_SWEEP_DIR = "/var/lib/kvtransit/sweep"
# A point whose pod failed (evicted, its node lost) is tried once more; a point that ran and failed is a row
# saying so, as in a local sweep, and is not retried.
RETRIES_PER_POINT = 1


@dataclass(frozen=True)
class SweepJobOptions:
    name: str = DEFAULT_NAME
    image: str = DEFAULT_IMAGE
    nodes: int | None = None  # nodes the points may use at once (None: as many as there are points)
    preferred_affinity: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)
    links: str = "auto"
    accuracy_sample: int = 2
    drain_timeout_s: float | None = None


def points_document(points: list[tuple[str, Scenario]]) -> str:
    """The points as the ConfigMap carries them: key and the scenario's fields as text, in order."""
    return json.dumps({"points": [{"key": key, "scenario": scenario_data(scenario)} for key, scenario in points]},
                      indent=1) + "\n"


def sweep_id(document: str) -> str:
    """Names one sweep's points, so logs of two different sweeps are never gathered into one file."""
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def points_from_document(text: str, where: str) -> list[tuple[str, Scenario]]:
    try:
        entries = json.loads(text)["points"]
        return [(entry["key"], scenario_from_data(entry["scenario"], f"{where}: point {i}"))
                for i, entry in enumerate(entries)]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: not a kvtransit sweep's points ({exc})") from None


def sweep_job(points: list[tuple[str, Scenario]], options: SweepJobOptions) -> dict[str, list[dict]]:
    """File name → manifests: the points ConfigMap and the Indexed Job."""
    if not points:
        raise ConfigError("sweep --render k8s: the grid has no points")
    for _, scenario in points:
        refuse_host_files(scenario, "a sweep rendered for k8s")
    names = Names(options.name)
    job_name = names.of("sweep")
    labels = names.labels("sweep")
    document = points_document(points)
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": f"{job_name}-points",
                              "labels": {**labels, "kvtransit.io/sweep": sweep_id(document)}},
                 "data": {POINTS_FILE: document}}
    args = ["kvtransit", "sweep", "--out", POD_SWEEP_DIR, "--run-point", f"{POINTS_MOUNT}/{POINTS_FILE}",
            "--links", options.links, "--accuracy-sample", str(options.accuracy_sample)]
    if options.drain_timeout_s is not None:
        args += ["--drain-timeout", repr(float(options.drain_timeout_s))]
    security: dict = {"capabilities": {"drop": ["ALL"]}}
    if options.links != "loopback":
        # `--links auto|netns` builds network namespaces (ip netns: a mount, CAP_SYS_ADMIN) and shapes them with
        # tc (CAP_NET_ADMIN), as `kvtransit up` does as root; without them auto falls back to loopback, and each
        # row's `placement` says which it got.
        security["capabilities"]["add"] = ["NET_ADMIN", "SYS_ADMIN"]
    container = {"name": "point", "image": options.image, "imagePullPolicy": "IfNotPresent", "args": args,
                 "volumeMounts": [{"name": "points", "mountPath": POINTS_MOUNT, "readOnly": True},
                                  {"name": "work", "mountPath": POD_SWEEP_DIR}],
                 "securityContext": security}
    pod_labels = {**labels, "kvtransit.io/sweep-job": job_name}
    affinity = one_per_node(pod_labels)
    if options.preferred_affinity:
        term = affinity["podAntiAffinity"].pop("requiredDuringSchedulingIgnoredDuringExecution")[0]
        affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 100, "podAffinityTerm": term}]
    pod_spec: dict = {"restartPolicy": "Never", "enableServiceLinks": False, "affinity": affinity}
    if options.node_selector:
        pod_spec["nodeSelector"] = dict(options.node_selector)
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = [{"name": "points", "configMap": {"name": f"{job_name}-points"}},
                           {"name": "work", "emptyDir": {}}]
    parallelism = len(points) if options.nodes is None else min(len(points), options.nodes)
    if parallelism < 1:
        raise ConfigError(f"--nodes must be >= 1, got {options.nodes}")
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job_name, "labels": labels},
           "spec": {"completionMode": "Indexed", "completions": len(points), "parallelism": parallelism,
                    "backoffLimitPerIndex": RETRIES_PER_POINT,
                    "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec}}}
    return {"sweep-points.yaml": [configmap], "sweep-job.yaml": [job]}
