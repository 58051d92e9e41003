"""`kvtransit up --ring-share`: the n − 1 follower ranks of each prefill's ring, and what the prefill is told.

A prefill that serves ring requests (flows/ring/ring_class.py) is rank 0 of a ring of `ring_ranks` GPUs; the other n − 1
are follower processes (`python -m kvtransit.flows.ring.follower`, flows/ring/). They run where their prefill runs
(its network namespace in netns mode: the ring link is the GPUs' own fabric, shaped in user space by the ranks'
channels, as a TP group's scale-up link is), on its loopback; the launcher starts them before their prefill, whose
`--ring-group` JSON then names their ports.
"""

from __future__ import annotations

import json
from typing import Any

from kvtransit.flows.ring.group import RingFollowerConfig, RingGroupConfig
from kvtransit.flows.ring.section import RingSection
from kvtransit.harness.up.agent_commands import AGENT_MODULE
from kvtransit.harness.up.flow_launch import FlowLaunch, LaunchContext
from kvtransit.harness.up.placement import LOOPBACK
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

RING_LOOPBACK = LOOPBACK  # the prefill's own loopback (its namespace's, in netns mode)


def ring_processes(scenario: Scenario) -> int:
    """Processes the rings add: n − 1 followers for each prefill instance (0 without a ring class)."""
    ring_section = RingSection.of(scenario)
    return (ring_section.ring_ranks - 1) * scenario.prefill if ring_section.on else 0


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


class RingLaunch(FlowLaunch):
    """Each prefill's ring: its n − 1 follower ranks beside it, before it, on its loopback."""

    GROUP_ROLES = ("ring-rank",)

    def check(self, ctx: LaunchContext) -> None:
        if ctx.frontend is not None:
            raise ConfigError("ring_share: the ring class gives the load generator's requests their long prompt; the "
                              "OpenAI front end's requests bring their own (give --ring-share 0 with the front end)")

    def extra_processes(self, scenario: Scenario) -> int:
        return ring_processes(scenario)

    def too_many(self, scenario: Scenario, room: int, others: int, cores: int) -> str:
        ring = RingSection.of(scenario)
        valid = [n for n in (2, 4, 8) if (n - 1) * scenario.prefill <= room]
        return (f"ring_ranks: {scenario.prefill} prefill instance(s) with rings of {ring.ring_ranks} need "
                f"{ring_processes(scenario)} more processes ({others} more for TP groups); this host has {cores} "
                f"cores, room for {room + others} (valid: {', '.join(map(str, valid)) or 'none'})")

    async def before(self, ctx: LaunchContext, role: str, index: int) -> list[str]:
        """`--ring-share`: the n − 1 follower ranks of prefill `index`'s ring, started where it will run; its
        `--ring-group` JSON."""
        if role != "prefill":
            return []
        scenario = ctx.scenario
        followers = [await ctx.start(f"prefill-{index}-ring-{rank}", "ring-rank",
                                     ctx.wrap("prefill", follower_argv(scenario, index, rank)), place="prefill")
                     for rank in range(1, RingSection.of(scenario).ring_ranks)]
        return ["--ring-group", leader_config(index, followers)]


LAUNCH = RingLaunch()
