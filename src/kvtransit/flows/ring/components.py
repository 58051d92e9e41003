"""Ring attention's part in `kvtransit up`'s prefill: the prefill as rank 0 of each ring request's ring.

`--ring-group JSON` (the launcher gives it: the n − 1 follower ranks' ports, flows/ring/launch.py) tells the prefill
the ring it leads; `RingPart` joins it before the prefill says it is ready and holds every ring request's step (a
batch of its own, planned by flows/ring/section.py): the rest of the prompt held, then the ring's attention run live
with the followers, every hop real bytes over the shaped ring link, measured. Its first token comes when the ring is
done (the next step starts from then, not from the model's end). A ring that fails fails its request, and every
later ring request, with the reason; the other requests go on.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from kvtransit.agents.prefill.parts import PrefillPart
from kvtransit.agents.skeleton import AgentContext, Part
from kvtransit.agents.stepping import StepFailed, StepHeld, StepTiming
from kvtransit.flows.ring.group import RingGroupConfig, RingGroupFailed, RingGroupLeader
from kvtransit.flows.ring.metrics import ring_metrics
from kvtransit.flows.ring.ring_class import RingPrefill
from kvtransit.flows.ring.section import RingSection
from kvtransit.model.errors import ConfigError

ARG = "ring_group"  # the flag's name in the agent's flow args


def add_flags(parser: argparse.ArgumentParser, role: str) -> None:
    if role == "prefill":
        parser.add_argument("--ring-group", dest=ARG, default="", metavar="JSON",
                            help="with --ring-share > 0: the ring this prefill leads as rank 0, its n - 1 follower "
                                 "ranks' ports (`kvtransit up` starts them and gives this)")


def refuse_unused(role: str, args: Mapping[str, Any]) -> None:
    if args.get(ARG):
        raise ConfigError("--ring-group: given with --ring-share 0 (no ring request to lead a ring for)")


def ring_config(given: Any) -> RingGroupConfig:
    if isinstance(given, RingGroupConfig):
        return given
    if not given:
        raise ConfigError("--ring-group: --ring-share > 0 needs the ring's followers (kvtransit up starts them and "
                          "passes this flag)")
    try:
        return RingGroupConfig(**json.loads(given))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--ring-group: {exc}") from None


def components(role: str, agent: Any, args: Mapping[str, Any]) -> list[Part]:
    return [RingPart(agent, ring_config(args.get(ARG)))] if role == "prefill" else []


class RingPart(PrefillPart):
    STEP_FLOWS: ClassVar[tuple[str, ...]] = ("ring",)
    name = "ring"

    def __init__(self, agent: Any, config: RingGroupConfig):
        self.scenario, self.clock = agent.scenario, agent.clock
        self.section = RingSection.of(self.scenario)
        self.leader = RingGroupLeader(config, self.scenario, self.clock)
        self.metrics = ring_metrics(agent.registry)
        # Each ring request's attention as measured, model seconds (the model's is the section's, for all), and how
        # many its ring failed.
        self.prompts: list[float] = []
        self.failed = 0

    async def start(self, ctx: AgentContext) -> None:
        await self.leader.start()  # as a TP group's: its followers are up (the launcher started them first)

    async def hold_step(self, plan: Any, timing: StepTiming) -> StepHeld:
        """A ring request's step from its start: the rest of its prompt held, then its attention round the ring
        (measured); ends late by how long the ring outlasted the model's end. Raises StepFailed."""
        ring, scenario = plan.extra, self.scenario
        assert isinstance(ring, RingPrefill)
        attention_start_ns = timing.end_ns - round(scenario.wall_s(ring.attention_s) * 1e9)
        try:  # ordered now, at the step's start: every rank is at the ring when the rest of the prompt is done
            done = await self.leader.prompt(attention_start_ns)
        except RingGroupFailed as exc:
            self.failed += 1
            self.metrics.prompts.labels(outcome="failed").inc()
            raise StepFailed(str(exc)) from None
        end_ns = self.clock.now_ns()
        measured_s = scenario.model_s((end_ns - attention_start_ns) / 1e9)
        self.prompts.append(measured_s)
        self.metrics.prompt_seconds.observe(measured_s)
        self.metrics.prompt_model_seconds.inc(ring.attention_s)
        self.metrics.prompts.labels(outcome="ok").inc()
        self.metrics.hop_bytes.inc(done.raw_bytes / self.section.scale(scenario))
        return StepHeld(max(0, end_ns - timing.end_ns), restart=True)

    def stats(self) -> dict[str, Any]:
        """The ring requests' attention, measured and modelled (model seconds), and rank 0's side of the ring."""
        return {"ring": {"measured_s": list(self.prompts), "model_s": self.section.model(self.scenario).attention_s,
                         "failed": self.failed, **self.leader.stats()}}

    async def close(self) -> None:
        await self.leader.close()
