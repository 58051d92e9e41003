"""A TP group's parts in `kvtransit up`'s agents: the prefill or decode as rank 0 of its instance's group.

`--tp-group JSON` (the launcher gives it: the N − 1 follower ranks' ports and the switch's, flows/tp/launch.py) tells
the prefill or decode the group it leads; `GroupPart` dials the followers before the agent says it is ready and holds
every step whose plan carries the group's collectives (agents/stepping.py): order the step to the followers, hold
the shard's compute, run rank 0's part of the real collectives (their frames held to the modelled scale-up link),
hold the rest of the step's collective time, and measure it (flows/tp/group/steps.py). A group that fails (a follower
gone, a deadline, a wrong sum) fails the step's requests with the reason, and every later step's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from kvtransit.agents.decode.parts import DecodePart
from kvtransit.agents.prefill.parts import PrefillPart
from kvtransit.agents.skeleton import AgentContext, Part
from kvtransit.agents.stepping import StepFailed, StepHeld, StepTiming
from kvtransit.flows.tp.group.leader import GroupFailed, GroupLeader, LeaderConfig
from kvtransit.flows.tp.group.steps import TpSteps
from kvtransit.flows.tp.section import ROLES, TpSection
from kvtransit.model.errors import ConfigError

ARG = "tp_group"  # the flag's name in the agent's flow args


def add_flags(parser: argparse.ArgumentParser, role: str) -> None:
    if role in ROLES:
        parser.add_argument("--tp-group", dest=ARG, default="", metavar="JSON",
                            help=f"with --{role}-tp N > 1: the group this {role} leads as rank 0, its N - 1 follower "
                                 "ranks' ports and the switch's (`kvtransit up` starts them and gives this)")


def leader_config(role: str, size: int, given: Any) -> LeaderConfig:
    """The group to lead: a LeaderConfig, or its JSON from the command line (a bad one is one line naming the
    flag)."""
    if isinstance(given, LeaderConfig):
        return given
    if not given:
        raise ConfigError(f"--tp-group: --{role}-tp {size} needs the group's followers (kvtransit up starts them and "
                          "passes this flag)")
    try:
        return LeaderConfig(**json.loads(given))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--tp-group: {exc}") from None


def refuse_unused(role: str, args: Mapping[str, Any]) -> None:
    if args.get(ARG):
        raise ConfigError(f"--tp-group: given with --{role}-tp 1 (one GPU has no group to lead)")


def components(role: str, agent: Any, args: Mapping[str, Any]) -> list[Part]:
    scenario = agent.scenario
    if role not in ROLES:
        return []
    size = TpSection.size(scenario, role)
    if size == 1:
        refuse_unused(role, args)
        return []
    return [GroupPart(agent, role, leader_config(role, size, args.get(ARG)))]


class GroupPart(PrefillPart, DecodePart):
    """Rank 0 of the instance's TP group: it leads the followers and holds the group's steps (a prefill's or a
    decode's: it answers only the step hooks both roles share, the others' defaults say nothing)."""

    STEP_FLOWS: ClassVar[tuple[str, ...]] = ("tp",)
    name = "TP group"

    def __init__(self, agent: Any, role: str, config: LeaderConfig):
        scenario = agent.scenario
        tp = TpSection.of(scenario)
        link = tp.scaled_link(scenario)
        self.clock = agent.clock
        self.role = role
        self.leader = GroupLeader(config, agent.clock, rate_Bps=link.bandwidth_Bps, latency_s=link.latency_s)
        self.steps = TpSteps(scenario, role, agent.registry, size=TpSection.size(scenario, role),
                             parallelism="ep" if role == "decode" and tp.decode_ep else "tp")
        self.failed_requests = 0  # a prefill's requests whose step's group failed (their clients told why)

    async def start(self, ctx: AgentContext) -> None:
        await self.leader.start()  # its followers are up (the launcher started them first): a failure is fatal

    async def hold_step(self, plan: Any, timing: StepTiming) -> StepHeld:
        try:
            late_ns = await self.steps.run(self.leader, self.clock, plan, fresh_start_ns=timing.fresh_start_ns,
                                           compute_end_ns=timing.compute_end_ns, end_ns=timing.end_ns)
        except GroupFailed as exc:
            if self.role == "prefill":
                self.failed_requests += len(plan.entries)
            raise StepFailed(str(exc)) from None
        return StepHeld(late_ns)

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {"tp_group": self.steps.stats(self.leader)}
        if self.role == "prefill":
            stats["tp_group_failed_requests"] = self.failed_requests
        return stats

    async def close(self) -> None:
        await self.leader.close()
