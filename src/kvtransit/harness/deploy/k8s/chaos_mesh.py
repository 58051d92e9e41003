"""`kvtransit chaos`'s scenarios as experiments on a cluster: Chaos Mesh NetworkChaos and PodChaos where Chaos Mesh
has the fault, a Job where the fault is the middlebox's own (its control API) or a probe of the agents' parsers.

Each experiment has the local scenario's name (`harness/studies/chaos.py: SCENARIOS`), its parameters (2 s faults, 2 %
of the link's rate, 20 ± 10 ms) and targets the testbed `kvtransit k8s render` makes (its labels), so the same run
is judged the same way: by the load generator's ledger (`kvtransit chaos --check-ledger LEDGER`).

| local scenario  | on a cluster                                                                              |
| --------------- | ----------------------------------------------------------------------------------------- |
| middlebox-kill  | PodChaos pod-kill, grace 0 (SIGKILL); the Deployment makes a new middlebox                 |
| decode-restart  | PodChaos pod-failure 2 s on decode-0: its process stops, the same pod (address) comes back |
| decode-kill     | PodChaos pod-kill, grace 0, decode-0; the StatefulSet makes it again under the same name   |
| link-down       | NetworkChaos partition middlebox → decode, 2 s (iptables)                                  |
| rate-collapse   | NetworkChaos bandwidth middlebox → decode at 2 % of the scaled link's rate, 2 s (tc)        |
| loss            | NetworkChaos loss middlebox → decode, 2 s (tc): packets dropped, TCP recovers them; the     |
|                 | local fault cuts the connection after 1 MiB instead                                       |
| latency         | NetworkChaos delay 20 ms ± 10 ms middlebox → decode, 2 s (tc)                              |
| slow-decode     | NetworkChaos partition decode → middlebox, 3 s: decode's ACKs stop and the middlebox's      |
|                 | send window closes, as when decode stops reading (Chaos Mesh cannot SIGSTOP a process)     |
| corrupt, reset-peer, slicer | a Job putting the middlebox's own fault (PUT /faults/NAME, then DELETE): a bit |
|                 | flipped on the wire fails TCP's checksum and never reaches the KV CRC; Chaos Mesh sends no  |
|                 | RST after N bytes and cannot re-cut writes                                                |
| malformed-peer, control-abuse | a Job running the local scenario in one pod: they probe the agents' input    |
|                 | checks, the same code wherever the agents run                                             |

Chaos Mesh's tc faults (bandwidth, loss, delay) replace every root qdisc of the pod they shape, the testbed's own
tbf included, and remove theirs after (pkg/chaosdaemon/tc_server.go: flush), leaving the link unshaped; the testbed
for chaos is therefore rendered with the middlebox's user-space shaper (`link_shaper="userspace"`).
Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvtransit.harness.deploy.k8s.naming import (
    COMPONENT,
    CONTROL_PORT,
    CONTROL_TOKEN_ENV,
    CONTROL_TOKEN_KEY,
    INSTANCE,
    Names,
)
from kvtransit.harness.studies.chaos import FAULT_FOR_S, SCENARIOS
from kvtransit.model.scenario import Scenario
from kvtransit.shaping.commands import burst_bytes, queue_limit_bytes, wire_rate_Bps
from kvtransit.shaping.spec import DEFAULT_MTU, LinkSpec
from kvtransit.shaping.units import format_rate_bits

CHAOS_MESH_API = "chaos-mesh.org/v1alpha1"
SCENARIO_LABEL = "kvtransit.io/chaos-scenario"
# The local scenarios' parameters (harness/studies/chaos.py, the function of each name), repeated here because the
# local ones are written inline there.
RATE_COLLAPSE_SHARE = 0.02  # _rate_collapse: 2 % of the link's rate
LATENCY = ("20ms", "10ms")  # _latency: latency_s 0.02, jitter_s 0.01
SLOW_DECODE_S = FAULT_FOR_S + 1.0  # _slow_decode: SIGSTOP for FAULT_FOR_S + 1 s
RESET_PEER_S = 1.0  # _reset_peer: on for 1 s
# Chaos Mesh's loss has no "cut after N bytes"; 30 % of the packets for 2 s collapses TCP's throughput on the link
# without ending the connection (a choice, not a measurement: the ledger judges the run either way).
LOSS_PERCENT = "30"
# Requests a cluster chaos run sends unless told: a minute of load at the local runs' 4/s (harness/studies/chaos.py:
# DEFAULT_RATE), time to apply an experiment by hand once the load generator is up (the local runs' 30 requests
# are 7.5 s, timed by the harness itself).
CLUSTER_REQUESTS = 240
# A process that ignores SIGTERM would otherwise be given the pod's default 30 s: these faults are kill -9.
KILL_GRACE_S = 0
# The middlebox's fault stages each local scenario puts through its control API (harness/studies/chaos.py: _corrupt,
# _reset_peer, _slicer): fault path name, body, seconds on.
CONTROL_FAULTS: dict[str, tuple[str, dict, float]] = {
    "corrupt": ("corrupt", {"type": "corrupt", "probability": 0.3, "seed": 7}, FAULT_FOR_S),
    "reset-peer": ("reset", {"type": "reset_peer", "after_bytes": 256 * 1024}, RESET_PEER_S),
    "slicer": ("slicer", {"type": "slicer", "average_bytes": 1500, "size_variation_bytes": 1000}, FAULT_FOR_S),
}
# Probes of the agents' own input checks, run as the local scenario in one pod.
IN_POD_SCENARIOS = ("malformed-peer", "control-abuse")
PUT_THEN_DELETE = """\
import json, os, sys, time, urllib.request
url, body, seconds = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
headers = {"Content-Type": "application/json"}
if os.environ.get("KVTRANSIT_CONTROL_TOKEN"):
    headers["Authorization"] = "Bearer " + os.environ["KVTRANSIT_CONTROL_TOKEN"]
for method, data in (("PUT", body), ("DELETE", None)):
    with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=10) as answer:
        print(method, url, answer.status, flush=True)
    if method == "PUT":
        time.sleep(seconds)
"""


@dataclass(frozen=True)
class ChaosTarget:
    """Where the testbed runs: its instance name, namespace and image (`kvtransit k8s render`'s)."""

    names: Names
    namespace: str
    image: str


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _selector(target: ChaosTarget, role: str, pod: str | None = None) -> dict:
    labels = {INSTANCE: target.names.instance, COMPONENT: role}
    if pod is not None:  # one named pod, as the local scenario signals `current(role)`: instance 0
        labels["statefulset.kubernetes.io/pod-name"] = pod
    return {"namespaces": [target.namespace], "labelSelectors": labels}


def _metadata(target: ChaosTarget, name: str) -> dict:
    return {"name": name, "labels": {**target.names.labels("chaos"), SCENARIO_LABEL: name}}


def _pod_chaos(target: ChaosTarget, name: str, action: str, role: str, *, pod: str | None = None,
               grace_s: int | None = None, duration_s: float | None = None) -> dict:
    spec: dict = {"action": action, "mode": "one", "selector": _selector(target, role, pod)}
    if grace_s is not None:
        spec["gracePeriod"] = grace_s
    if duration_s is not None:
        spec["duration"] = _seconds(duration_s)
    return {"apiVersion": CHAOS_MESH_API, "kind": "PodChaos", "metadata": _metadata(target, name), "spec": spec}


def _network_chaos(target: ChaosTarget, name: str, action: str, *, source: str, sink: str, duration_s: float,
                   **parameters: dict) -> dict:
    """`action` on the packets `source`'s pods send to `sink`'s pods (direction "to")."""
    spec = {"action": action, "mode": "all", "selector": _selector(target, source), "direction": "to",
            "target": {"mode": "all", "selector": _selector(target, sink)}, **parameters,
            "duration": _seconds(duration_s)}
    return {"apiVersion": CHAOS_MESH_API, "kind": "NetworkChaos", "metadata": _metadata(target, name), "spec": spec}


def collapsed_bandwidth(scenario: Scenario) -> dict:
    """NetworkChaos `bandwidth` at RATE_COLLAPSE_SHARE of the scaled link, with tbf's bucket and queue sized as
    the testbed's own tbf (shaping/commands.py) would size them for that rate."""
    goodput = scenario.scaled_link.bandwidth_Bps * RATE_COLLAPSE_SHARE
    wire = wire_rate_Bps(goodput, DEFAULT_MTU)
    return {"rate": format_rate_bits(wire), "buffer": burst_bytes(wire),
            "limit": queue_limit_bytes(LinkSpec(rate_Bps=goodput), wire)}


def _control_fault_job(target: ChaosTarget, name: str) -> dict:
    fault, body, seconds = CONTROL_FAULTS[name]
    url = f"http://{target.names.service_address('middlebox', CONTROL_PORT)}/faults/{fault}"
    container = {"name": "fault", "image": target.image, "imagePullPolicy": "IfNotPresent",
                 "command": ["python3", "-c", PUT_THEN_DELETE, url, json.dumps(body), repr(float(seconds))],
                 "env": [{"name": CONTROL_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
                     "name": target.names.control_secret, "key": CONTROL_TOKEN_KEY, "optional": True}}}]}
    return _job(target, name, container)


def _in_pod_job(target: ChaosTarget, name: str, requests: int, rate: float) -> dict:
    container = {"name": "probe", "image": target.image, "imagePullPolicy": "IfNotPresent",
                 "args": ["kvtransit", "chaos", name, "--links", "loopback", "--requests", str(requests),
                          "--rate", repr(float(rate))]}
    return _job(target, name, container)


def _job(target: ChaosTarget, name: str, container: dict) -> dict:
    container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(target, name),
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"labels": {**target.names.labels("chaos"), SCENARIO_LABEL: name}},
                "spec": {"restartPolicy": "Never", "enableServiceLinks": False, "containers": [container]}}}}


def experiments(scenario: Scenario, target: ChaosTarget) -> dict[str, dict]:
    """Local scenario name → its cluster experiment, for every scenario `kvtransit chaos` runs, in its order."""
    decode_0 = f"{target.names.of('decode')}-0"
    built: dict[str, dict] = {
        "middlebox-kill": _pod_chaos(target, "middlebox-kill", "pod-kill", "middlebox", grace_s=KILL_GRACE_S),
        "decode-restart": _pod_chaos(target, "decode-restart", "pod-failure", "decode", pod=decode_0,
                                     duration_s=FAULT_FOR_S),
        "decode-kill": _pod_chaos(target, "decode-kill", "pod-kill", "decode", pod=decode_0, grace_s=KILL_GRACE_S),
        "link-down": _network_chaos(target, "link-down", "partition", source="middlebox", sink="decode",
                                    duration_s=FAULT_FOR_S),
        "rate-collapse": _network_chaos(target, "rate-collapse", "bandwidth", source="middlebox", sink="decode",
                                        duration_s=FAULT_FOR_S, bandwidth=collapsed_bandwidth(scenario)),
        "loss": _network_chaos(target, "loss", "loss", source="middlebox", sink="decode", duration_s=FAULT_FOR_S,
                               loss={"loss": LOSS_PERCENT}),
        "latency": _network_chaos(target, "latency", "delay", source="middlebox", sink="decode",
                                  duration_s=FAULT_FOR_S, delay={"latency": LATENCY[0], "jitter": LATENCY[1]}),
        "slow-decode": _network_chaos(target, "slow-decode", "partition", source="decode", sink="middlebox",
                                      duration_s=SLOW_DECODE_S),
    }
    built.update({name: _control_fault_job(target, name) for name in CONTROL_FAULTS})
    built.update({name: _in_pod_job(target, name, scenario.requests, scenario.rate) for name in IN_POD_SCENARIOS})
    return {name: built[name] for name in SCENARIOS if name in built}


def describe(manifest: dict) -> str:
    """One line for the index: the kind and what it does."""
    spec = manifest["spec"]
    if manifest["kind"] == "Job":
        return "Job: " + ("the middlebox's own fault, PUT then DELETE on its control API"
                          if manifest["metadata"]["name"] in CONTROL_FAULTS else "the local scenario in one pod")
    action = spec["action"]
    role = spec["selector"]["labelSelectors"][COMPONENT]
    if manifest["kind"] == "PodChaos":
        return f"PodChaos {action} on {role}" + (f" for {spec['duration']}" if "duration" in spec else "")
    sink = spec["target"]["selector"]["labelSelectors"][COMPONENT]
    return f"NetworkChaos {action} {role} -> {sink} for {spec['duration']}"
