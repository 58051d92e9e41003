"""`kvtransit up --ring-share`: the n − 1 follower ranks of each prefill's ring, and what the prefill is told.

A prefill that serves ring requests (flows/ring/ring_class.py) is rank 0 of a ring of `ring_ranks` GPUs; the other n − 1
are follower processes (`python -m kvtransit.flows.ring.follower`, flows/ring/). They run where their prefill runs
(its network namespace in netns mode: the ring link is the GPUs' own fabric, shaped in user space by the ranks'
channels, as a TP group's scale-up link is), on its loopback; the launcher starts them before their prefill, whose
`--ring-group` JSON then names their ports.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kvtransit.flows.ring.group import RingFollowerConfig, RingGroupConfig
from kvtransit.flows.tp.processes import ROLES, extra_processes
from kvtransit.flows.tp.run import PROCESSES_PER_CORE
from kvtransit.harness.up.agent_commands import AGENT_MODULE
from kvtransit.harness.up.placement import LOOPBACK
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

RING_LOOPBACK = LOOPBACK  # the prefill's own loopback (its namespace's, in netns mode)


def ring_processes(scenario: Scenario) -> int:
    """Processes the rings add: n − 1 followers for each prefill instance (0 without a ring class)."""
    return (scenario.ring_ranks - 1) * scenario.prefill if scenario.ring else 0


def check_host(scenario: Scenario, cores: int | None = None) -> None:
    """Rings (with any TP groups) larger than this host can start are a one-line error with the sizes it can."""
    if not scenario.ring:
        return
    cores = cores or os.cpu_count() or 1
    room = PROCESSES_PER_CORE * cores
    groups = sum(extra_processes(scenario, role) * (scenario.prefill if role == "prefill" else scenario.decode)
                 for role in ROLES)
    if ring_processes(scenario) + groups > room:
        valid = [n for n in (2, 4, 8) if (n - 1) * scenario.prefill + groups <= room]
        raise ConfigError(f"ring_ranks: {scenario.prefill} prefill instance(s) with rings of {scenario.ring_ranks} "
                          f"need {ring_processes(scenario)} more processes ({groups} more for TP groups); this host "
                          f"has {cores} cores, room for {room} (valid: {', '.join(map(str, valid)) or 'none'})")


def follower_argv(scenario: Scenario, index: int, rank: int) -> list[str]:
    config = RingFollowerConfig(index=index, rank=rank, host=RING_LOOPBACK, leader=f"prefill-{index}",
                                scenario=scenario.as_dict())
    return [AGENT_MODULE[0], "-m", "kvtransit.flows.ring.follower", "--config", config.to_json()]


def leader_config(index: int, followers: list[dict[str, Any]]) -> str:
    """The prefill's `--ring-group` JSON, from its followers' readiness lines."""
    config = RingGroupConfig(index=index, host=RING_LOOPBACK,
                             followers=[{"control": [RING_LOOPBACK, f["control_port"]],
                                         "ring": [RING_LOOPBACK, f["ring_port"]]} for f in followers])
    return json.dumps({"index": config.index, "followers": config.followers, "host": config.host})
