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
from typing import Any

from kvtransit.flows.tp.group.orders import IDLE_WAIT_S, FollowerConfig
from kvtransit.flows.tp.model import ALLREDUCE_SWITCH
from kvtransit.flows.tp.section import TpSection
from kvtransit.harness.up.agent_commands import AGENT_MODULE
from kvtransit.harness.up.flow_launch import FlowLaunch, LaunchContext
from kvtransit.harness.up.placement import LOOPBACK
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.group_link.timing import COLLECTIVE_DEADLINE_S

GROUP_LOOPBACK = LOOPBACK  # the leader's own loopback (its namespace's, in netns mode)


PREFILL_GROUP_BASE = 1001  # a prefill's group id: this + its index (a decode's: its index + 1)
ROLES = ("prefill", "decode")


def group_size(scenario: Scenario, role: str) -> int:
    return scenario.prefill_tp if role == "prefill" else scenario.decode_tp


def group_id(role: str, index: int) -> int:
    return (PREFILL_GROUP_BASE if role == "prefill" else 1) + index


def extra_processes(scenario: Scenario, role: str) -> int:
    """Processes one instance's group adds: N − 1 followers (+ the switch)."""
    tp = TpSection.of(scenario)
    size = group_size(scenario, role)
    if size == 1:
        return 0
    return size - 1 + (1 if tp.allreduce == ALLREDUCE_SWITCH else 0)


def instance_processes(scenario: Scenario) -> dict[str, int]:
    """Processes every instance's group adds, by role: its followers (and switch) × the role's instances."""
    return {role: extra_processes(scenario, role) * (scenario.prefill if role == "prefill" else scenario.decode)
            for role in ROLES}


def follower_argv(scenario: Scenario, role: str, index: int, rank: int) -> list[str]:
    tp_section = TpSection.of(scenario)
    link = tp_section.scaled_link(scenario)
    config = FollowerConfig(group=group_id(role, index), rank=rank, size=group_size(scenario, role),
                            mode=tp_section.allreduce, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s,
                            deadline_s=COLLECTIVE_DEADLINE_S, host=GROUP_LOOPBACK, leader=f"{role}-{index}")
    return [AGENT_MODULE[0], "-m", "kvtransit.flows.tp.group", "--config", config.to_json()]


def switch_argv(scenario: Scenario, role: str, index: int, metrics_host: str) -> list[str]:
    """The switch on the group's scale-up link (its rate and latency at the run's scale and dilation, the run's
    module), one all-reduce a step; plain asyncio, as the ranks' own."""
    link = TpSection.of(scenario).scaled_link(scenario)
    config = {"rate_Bps": link.bandwidth_Bps, "latency_s": link.latency_s, "scale": scenario.effective_scale,
              "deadline_s": COLLECTIVE_DEADLINE_S, "collectives": 1, "idle_s": IDLE_WAIT_S}
    return [*AGENT_MODULE, "middlebox", *scenario.to_argv(), "--placement", "switch",
            "--ranks", str(group_size(scenario, role)), "--group", str(group_id(role, index)),
            "--name", f"{role}-{index}-switch", "--loop", "asyncio", "--listen", f"{GROUP_LOOPBACK}:0",
            "--metrics-listen", f"{metrics_host}:0", "--switch-config", json.dumps(config)]


def leader_config(scenario: Scenario, role: str, index: int, followers: list[dict[str, Any]],
                  switch: dict[str, Any] | None) -> str:
    """The leader's `--tp-group` JSON, from its followers' (and the switch's) readiness lines."""
    tp_section = TpSection.of(scenario)
    config: dict[str, Any] = {
        "group": group_id(role, index), "size": group_size(scenario, role), "mode": tp_section.allreduce,
        "followers": [{"control": [GROUP_LOOPBACK, f["control_port"]], "ring": [GROUP_LOOPBACK, f["ring_port"]]}
                      for f in followers],
        "host": GROUP_LOOPBACK, "deadline_s": COLLECTIVE_DEADLINE_S}
    if switch is not None:
        config["switch"] = [GROUP_LOOPBACK, switch["listen_port"]]
    return json.dumps(config)


class TpLaunch(FlowLaunch):
    """Each prefill's and decode's group: its follower ranks (and switch) beside it, before it, on its loopback."""

    GROUP_ROLES = ("tp-rank", "switch")

    def check(self, ctx: LaunchContext) -> None:
        if ctx.scenario.decode_tp > 1 and "decode" in ctx.restart_roles:
            raise ConfigError("--restart decode: a decode that leads a TP group (--decode-tp > 1) cannot be restarted "
                              "alone (its followers' ring is joined to it); restart: middlebox")

    def extra_processes(self, scenario: Scenario) -> int:
        return sum(instance_processes(scenario).values())

    def too_many(self, scenario: Scenario, room: int, others: int, cores: int) -> str:
        """Groups larger than the room left: the role with the most, and the sizes that would fit."""
        extra = instance_processes(scenario)
        role = max(extra, key=lambda r: extra[r])
        instances = scenario.prefill if role == "prefill" else scenario.decode
        other = sum(extra.values()) - extra[role] + others
        switch = 1 if TpSection.of(scenario).allreduce == ALLREDUCE_SWITCH else 0
        per_instance = (room + others - other) // instances - switch + 1
        valid = [n for n in range(2, per_instance + 1) if scenario.model_spec.n_heads % n == 0]
        return (f"{role}_tp: {instances} {role} instance(s) of TP {group_size(scenario, role)} need {extra[role]} more "
                f"processes ({other} more for the other role's groups); this host has {cores} cores, room for "
                f"{room + others} (valid: {', '.join(map(str, [1, *valid]))})")

    async def before(self, ctx: LaunchContext, role: str, index: int) -> list[str]:
        """`--prefill-tp / --decode-tp N`: the follower ranks (and switch) of `role` instance `index`, started where it
        will run; its `--tp-group` JSON."""
        scenario = ctx.scenario
        if role not in ROLES or group_size(scenario, role) == 1:
            return []
        switch = None
        if TpSection.of(scenario).allreduce == ALLREDUCE_SWITCH:
            switch = await ctx.start(f"{role}-{index}-switch", "switch",
                                     ctx.wrap(role, switch_argv(scenario, role, index, ctx.host(role))), place=role)
        followers = [await ctx.start(f"{role}-{index}-rank-{rank}", "tp-rank",
                                     ctx.wrap(role, follower_argv(scenario, role, index, rank)), place=role)
                     for rank in range(1, group_size(scenario, role))]
        return ["--tp-group", leader_config(scenario, role, index, followers, switch)]


LAUNCH = TpLaunch()
