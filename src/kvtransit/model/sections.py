"""A flow's part of the scenario, and the questions the core's pure decisions ask every flow.

`Scenario` holds the core's fields (the model, its GPUs, the hand-off link and its kernel, the workload, the
emulation) and one `Section` per registered flow (kvtransit/flows/__init__.py: FLOWS): the flow's own fields, each a
flag of its own under the name it has always had (`--ring-share`, `--kv-pool`), its checks and its derived figures.
A flow that is off keeps its default section, which `enabled` says is off: a null object, so the core never asks
whether a flow exists, only what its sections answer.

The core's serving decisions (model/serving/) ask every enabled section the same few questions, each with a
"nothing to add" default here; a flow that changes a decision answers its question and the core stays unaware of
which flow did (ring attention makes a request a step of its own; a TP group adds its collectives to a step; a
prefix workload brings its own requests). The questions:

- `runs_alone(scenario, request_id)`: does this request take a prefill step of its own?
- `prefill_step(scenario, entries)`: the plan of a step the flow plans itself (None: the core plans it);
- `prefill_seconds(scenario, request)`: what a request costs its prefill instance, for the offered-load check
  before a run (None: the core's roofline share);
- `group_step(scenario, role, work, tokens)`: a TP group's step (the shard's roofline plus its collectives);
- `requests(scenario)` / `shape_requests(scenario, specs)` / `workload(scenario)`: where the requests come from, what
  a flow changes in them, and what the report says of them;
- `check(scenario)`: the cross-field checks (after the core's own), a ConfigError naming the field;
- `describe(scenario)`: derived figures for the report's `config` block;
- `prefix_cache(scenario)`: a prefill instance's own prefix cache as the twin asks it (a lookup before a request
  queues, a write-back once its step ran; None: no prefix reuse at the prefill);
- `twin_gap(scenario)`: what the twin (twin/serving.py) would leave out of the flow (None: nothing, the answers above
  are all it changes).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from kvtransit.model.cost.roofline import StepWork
    from kvtransit.model.scenario import Scenario
    from kvtransit.model.serving.prefill_plan import BatchEntry, PrefillStepPlan
    from kvtransit.model.serving.workload import RequestSpec

S = TypeVar("S", bound="Section")


class PrefixCache(Protocol):
    """One prefill instance's prefix cache, as a flow answers `Section.prefix_cache`."""

    def lookup(self, request: RequestSpec) -> int:
        """Prompt tokens of `request` found cached (its blocks touched as the live cache touches them)."""
        ...

    def computed(self, request: RequestSpec) -> None:
        """`request`'s (last) step ran: hold the blocks it computed that the cache lacked (the write-back)."""
        ...


class StepExtra:
    """What a flow adds to a planned step for its live part to run (a TP group's real collectives, a ring's model):
    the agent hands the step to the component of the flow named here (agents/stepping.py)."""

    FLOW: ClassVar[str] = ""


@dataclass(frozen=True)
class GroupStep:
    """A step as a TP group holds it: `total_s` model seconds, of which `collective_s` are its collectives, and what
    of them the live group carries for real (`extra`)."""

    total_s: float
    collective_s: float
    extra: StepExtra | None = None


@dataclass(frozen=True)
class Section:
    """A flow's fields in the scenario (subclasses are frozen dataclasses whose fields are flat scenario fields)."""

    FLOW: ClassVar[str] = ""  # the flow's name in the registry
    HELP: ClassVar[Mapping[str, str]] = {}  # each field's flag help

    @classmethod
    def of(cls: type[S], scenario: Scenario) -> S:
        """This flow's section of `scenario`."""
        return scenario.section(cls)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def enabled(self, scenario: Scenario) -> bool:
        """Is the flow on in `scenario` (a section left at its defaults is off)?"""
        return False

    def changed(self) -> list[str]:
        """The fields set to something other than their default, in field order."""
        return [f.name for f in fields(self) if getattr(self, f.name) != f.default]

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.field_names()}

    # -- checks and figures --------------------------------------------------------------------------------
    def check(self, scenario: Scenario) -> None:
        """Cross-field checks, after the core's own (each field's own range is checked in __post_init__)."""

    def describe(self, scenario: Scenario) -> dict[str, Any]:
        """Derived figures for the report's config block (beside the fields themselves)."""
        return {}

    def brings_prompts(self) -> bool:
        """Does this flow give the requests their prompts (a prefix workload), as a trace would?"""
        return False

    # -- the serving decisions' questions (model/serving/) --------------------------------------------------
    def runs_alone(self, scenario: Scenario, request_id: int) -> bool:
        return False

    def prefill_step(self, scenario: Scenario, entries: Sequence[BatchEntry]) -> PrefillStepPlan | None:
        return None

    def prefill_seconds(self, scenario: Scenario, request: RequestSpec) -> float | None:
        return None

    def group_step(self, scenario: Scenario, role: str, work: StepWork, tokens: int) -> GroupStep | None:
        """A step of `work` on `role`'s instance ("prefill" or "decode") as a group holds it, `tokens` tokens of
        activations through every layer (None: the instance is one GPU group, its roofline alone)."""
        return None

    def requests(self, scenario: Scenario) -> list[RequestSpec] | None:
        return None

    def shape_requests(self, scenario: Scenario, specs: list[RequestSpec]) -> list[RequestSpec]:
        return specs

    def workload(self, scenario: Scenario) -> dict[str, Any] | None:
        return None

    def prefix_cache(self, scenario: Scenario) -> PrefixCache | None:
        return None

    # -- the twin (twin/serving.py) -------------------------------------------------------------------------
    def twin_gap(self, scenario: Scenario) -> str | None:
        """Why the twin cannot run this flow as `scenario` sets it, or None when it can: when every decision the flow
        changes is one of the questions above, which the twin asks as the agents do. A flow says so itself; until it
        does, the twin refuses it by name rather than run the scenario without it."""
        return "the twin has no model of it yet"
