"""`kvtransit up --prefill-tp / --decode-tp N`: what each instance's TP group runs as, and what its leader is told.

An instance of N GPUs is the prefill or decode process (rank 0, the leader: flows/tp/group/leader.py) and N − 1
follower rank processes (`python -m kvtransit.flows.tp.group`), with `--allreduce switch` also a switch that sums in
the network (`kvtransit middlebox --placement switch --ranks N`, flows/tp/switch/). They run where their leader runs
(the decode's network namespace in netns mode: the scale-up link is inside one server), on its loopback, and the
launcher starts them before the leader, whose `--tp-group` JSON then names their ports. Group ids: a decode's its
index + 1, a prefill's PREFILL_GROUP_BASE + its index.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kvtransit.flows.tp.group.orders import COLLECTIVE_DEADLINE_S, IDLE_WAIT_S, FollowerConfig
from kvtransit.flows.tp.model import ALLREDUCE_SWITCH
from kvtransit.flows.tp.run import PROCESSES_PER_CORE
from kvtransit.harness.up.agent_commands import AGENT_MODULE
from kvtransit.harness.up.placement import LOOPBACK
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

GROUP_LOOPBACK = LOOPBACK  # the leader's own loopback (its namespace's, in netns mode)


PREFILL_GROUP_BASE = 1001  # a prefill's group id: this + its index (a decode's: its index + 1)
ROLES = ("prefill", "decode")


def group_size(scenario: Scenario, role: str) -> int:
    return scenario.prefill_tp if role == "prefill" else scenario.decode_tp


def group_id(role: str, index: int) -> int:
    return (PREFILL_GROUP_BASE if role == "prefill" else 1) + index


def extra_processes(scenario: Scenario, role: str) -> int:
    """Processes one instance's group adds: N − 1 followers (+ the switch)."""
    size = group_size(scenario, role)
    if size == 1:
        return 0
    return size - 1 + (1 if scenario.allreduce == ALLREDUCE_SWITCH else 0)


def check_host(scenario: Scenario, cores: int | None = None) -> None:
    """Groups larger than this host can start are a one-line error with the sizes it can."""
    cores = cores or os.cpu_count() or 1
    room = PROCESSES_PER_CORE * cores
    extra = {role: extra_processes(scenario, role) * (scenario.prefill if role == "prefill" else scenario.decode)
             for role in ROLES}
    if sum(extra.values()) > room:
        role = max(extra, key=lambda r: extra[r])
        instances = scenario.prefill if role == "prefill" else scenario.decode
        other = sum(extra.values()) - extra[role]
        per_instance = (room - other) // instances - (1 if scenario.allreduce == ALLREDUCE_SWITCH else 0) + 1
        valid = [n for n in range(2, per_instance + 1) if scenario.model_spec.n_heads % n == 0]
        raise ConfigError(f"{role}_tp: {instances} {role} instance(s) of TP {group_size(scenario, role)} need "
                          f"{extra[role]} more processes ({other} more for the other role's groups); this host has "
                          f"{cores} cores, room for {room} (valid: {', '.join(map(str, [1, *valid]))})")


def follower_argv(scenario: Scenario, role: str, index: int, rank: int) -> list[str]:
    link = scenario.scaled_scaleup_link
    config = FollowerConfig(group=group_id(role, index), rank=rank, size=group_size(scenario, role),
                            mode=scenario.allreduce, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s,
                            deadline_s=COLLECTIVE_DEADLINE_S, host=GROUP_LOOPBACK, leader=f"{role}-{index}")
    return [AGENT_MODULE[0], "-m", "kvtransit.flows.tp.group", "--config", config.to_json()]


def switch_argv(scenario: Scenario, role: str, index: int, metrics_host: str) -> list[str]:
    """The switch on the group's scale-up link (its rate and latency at the run's scale and dilation, the run's
    module), one all-reduce a step; plain asyncio, as the ranks' own."""
    link = scenario.scaled_scaleup_link
    config = {"rate_Bps": link.bandwidth_Bps, "latency_s": link.latency_s, "scale": scenario.effective_scale,
              "deadline_s": COLLECTIVE_DEADLINE_S, "collectives": 1, "idle_s": IDLE_WAIT_S}
    return [*AGENT_MODULE, "middlebox", *scenario.to_argv(), "--placement", "switch",
            "--ranks", str(group_size(scenario, role)), "--group", str(group_id(role, index)),
            "--name", f"{role}-{index}-switch", "--loop", "asyncio", "--listen", f"{GROUP_LOOPBACK}:0",
            "--metrics-listen", f"{metrics_host}:0", "--switch-config", json.dumps(config)]


def leader_config(scenario: Scenario, role: str, index: int, followers: list[dict[str, Any]],
                  switch: dict[str, Any] | None) -> str:
    """The leader's `--tp-group` JSON, from its followers' (and the switch's) readiness lines."""
    config: dict[str, Any] = {
        "group": group_id(role, index), "size": group_size(scenario, role), "mode": scenario.allreduce,
        "followers": [{"control": [GROUP_LOOPBACK, f["control_port"]], "ring": [GROUP_LOOPBACK, f["ring_port"]]}
                      for f in followers],
        "host": GROUP_LOOPBACK, "deadline_s": COLLECTIVE_DEADLINE_S}
    if switch is not None:
        config["switch"] = [GROUP_LOOPBACK, switch["listen_port"]]
    return json.dumps(config)
