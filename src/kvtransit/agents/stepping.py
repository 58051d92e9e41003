"""How a stepping agent (prefill, decode) holds a planned step, and how a flow's part holds it instead.

A step's plan (model/serving/prefill_plan.py, decode_plan.py) may carry a flow's `extra` (model/sections.py:
`StepExtra`): a TP group's real collectives, a ring request's attention. Such a step is held by the part of that
flow (`StepHolder.hold_step`), which runs the flow's live part with its peers (order the followers, hold the
compute, run the real collectives, hold to the step's end) and says how late the step ended. Any other step is
held by the clock alone, to its due end. A flow's live part that fails raises `StepFailed`: the agent fails the
step's requests (or the ones it names) with the reason, and starts a new schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvtransit.agents.skeleton import Part
from kvtransit.runtime.clock import Clock


@dataclass(frozen=True)
class StepTiming:
    """A step's due times on the injected clock (ns)."""

    start_ns: int  # its due start (the previous step's due end, or now after idling)
    end_ns: int  # its due end: start + the plan's wall time
    compute_end_ns: int  # the end of its held compute, before its collectives: start + compute_s × dilation
    fresh_start_ns: int | None  # the schedule's start when this step began one after idling (None: it followed one)


@dataclass(frozen=True)
class StepHeld:
    late_ns: int  # how late the step ended after `end_ns` (0: on time)
    restart: bool = False  # the next step starts from when this one ended as measured (a new schedule)


class StepFailed(Exception):
    """A flow's live part of a step failed; the message is the reason the requests fail with. `request_ids`: the
    ones it concerns (None: every request of the step)."""

    def __init__(self, reason: str, request_ids: Sequence[int] | None = None):
        super().__init__(reason)
        self.request_ids = None if request_ids is None else list(request_ids)


class StepHolder(Part):
    """A part that holds the steps whose plan carries an `extra` of one of its `STEP_FLOWS`."""

    STEP_FLOWS: ClassVar[tuple[str, ...]] = ()

    async def hold_step(self, plan: Any, timing: StepTiming) -> StepHeld:
        raise NotImplementedError


class StepHolders:
    """The agent's holders by the flow they hold steps for; a step of no flow is held by the clock."""

    def __init__(self, clock: Clock, parts: Sequence[Part]):
        self.clock = clock
        self._by_flow: dict[str, StepHolder] = {}
        for part in parts:
            if isinstance(part, StepHolder):
                for flow in part.STEP_FLOWS:
                    if flow in self._by_flow:
                        raise ValueError(f"two parts hold {flow} steps: {self._by_flow[flow].name}, {part.name}")
                    self._by_flow[flow] = part

    async def hold(self, plan: Any, timing: StepTiming) -> StepHeld:
        """Hold `plan`'s step: its flow's part's way, or to its due end on the clock."""
        extra = plan.extra
        if extra is None:
            return StepHeld(await self.clock.sleep_until(timing.end_ns))
        holder = self._by_flow.get(extra.FLOW)
        if holder is None:
            raise RuntimeError(f"a {extra.FLOW} step, and no part of this agent holds {extra.FLOW} steps")
        return await holder.hold_step(plan, timing)
