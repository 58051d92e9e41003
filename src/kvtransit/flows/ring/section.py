"""Ring attention's part of the scenario (`--ring-share`): which requests a ring prefills, and what the model says
their prefill takes.

A share (`ring_share`) of the requests has a prompt of `ring_prompt` tokens, prefilled by a ring of `ring_ranks`
GPUs over `ring_link`: the prefill instance's GPU and n − 1 ring processes (flows/ring/ring_class.py says what a
ring request's step holds). The section answers the serving decisions' questions for them: a ring request takes a
prefill step of its own, planned as the ring's; its prompt is the ring's; its share of the prefill's time is its
whole ring prefill.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvtransit.flows.ring.ring_class import RING_RANKS, RingPrefill, in_ring_class, ring_prefill, with_ring_prompts
from kvtransit.model.catalog.links import LINKS, Link, link_by_name
from kvtransit.model.cost.roofline import prefill_work_cached, step_energy_j
from kvtransit.model.errors import ConfigError, unknown_name
from kvtransit.model.field_checks import number
from kvtransit.model.kv_scale import HOST_BUDGET_BPS, KvLayout, scaled_layout
from kvtransit.model.sections import Section
from kvtransit.model.serving.layerwise import HANDOFF_WHOLE

if TYPE_CHECKING:
    from kvtransit.model.scenario import Scenario
    from kvtransit.model.serving.prefill_plan import BatchEntry, PrefillStepPlan
    from kvtransit.model.serving.workload import RequestSpec


@dataclass(frozen=True)
class RingSection(Section):
    FLOW: ClassVar[str] = "ring"
    HELP: ClassVar[dict[str, str]] = {
        "ring_share": "ring attention: share of the requests whose long prompt (--ring-prompt) a ring of GPUs "
                      "prefills, in [0, 1] (0: none)",
        "ring_ranks": "ring attention: GPUs in the ring, 2, 4 or 8 (the instance's and n - 1 ring processes)",
        "ring_link": "ring attention: the link between ring neighbours (catalogue key)",
        "ring_prompt": "ring attention: tokens of a ring request's prompt, a multiple of --ring-ranks",
    }

    ring_share: float = 0.0  # share of the requests in the ring class (0: none)
    ring_ranks: int = 4  # GPUs in the ring (docs/reference.md §7: 2, 4, 8)
    ring_link: str = "eth-100g"  # the link between ring neighbours (`kvtransit ring`'s default)
    ring_prompt: int = 32768  # tokens of a ring request's prompt (the deck's 32k)

    def __post_init__(self) -> None:
        number("ring_share", self.ring_share, lo=0, hi=1)
        if not self.ring_share:
            # No ring class: the other fields at their defaults, or they would be silently ignored.
            given = [name for name in self.changed() if name != "ring_share"]
            if given:
                raise ConfigError(f"{given[0]}: needs a ring class (--ring-share in (0, 1]); valid ring_share: "
                                  "0 (no ring) up to 1")
            return
        ranks = number("ring_ranks", self.ring_ranks, integer=True)
        if ranks not in RING_RANKS:
            raise ConfigError(f"ring_ranks: {self.ring_ranks!r} is not a ring this emulation starts "
                              f"(valid: {', '.join(map(str, RING_RANKS))})")
        object.__setattr__(self, "ring_ranks", int(ranks))
        if self.ring_link not in LINKS:
            raise ConfigError(f"ring_link: {unknown_name('link', self.ring_link, LINKS)}")
        prompt = int(number("ring_prompt", self.ring_prompt, lo=self.ring_ranks, integer=True))
        if prompt % self.ring_ranks:
            raise ConfigError(f"ring_prompt: {prompt} tokens do not split into {self.ring_ranks} equal blocks "
                              f"(valid: a multiple of {self.ring_ranks})")
        object.__setattr__(self, "ring_prompt", prompt)

    @property
    def on(self) -> bool:
        """A share of the requests is prefilled by a ring."""
        return self.ring_share > 0

    def enabled(self, scenario: Scenario) -> bool:
        return self.on

    def check(self, scenario: Scenario) -> None:
        if not self.ring_share:
            return
        if self.ring_prompt > scenario.kv_capacity_tokens:
            raise ConfigError(f"ring_prompt: {self.ring_prompt} tokens of KV do not fit one decode instance "
                              f"({scenario.kv_capacity_tokens} tokens on {scenario.gpus}x {scenario.device}); give "
                              "fewer")
        for name, value, valid in (("prefill_tp", scenario.prefill_tp, 1),
                                   ("prefill_chunk", scenario.prefill_chunk, 0)):
            if value != valid:
                raise ConfigError(f"ring_share: a ring request's prefill is the ring's; with {name} {value} it is "
                                  f"not built (give --{name.replace('_', '-')} {valid})")
        if scenario.handoff != HANDOFF_WHOLE:
            raise ConfigError(f"ring_share: a ring request hands its KV off whole; with handoff {scenario.handoff!r} "
                              f"it is not built (give --handoff {HANDOFF_WHOLE})")
        if scenario.brings_prompts():
            raise ConfigError("ring_share: the ring class gives its requests their own prompt length; a trace or a "
                              "prefix workload brings its own (give --ring-share 0 with --trace or --prefix-workload)")

    # -- the ring's figures ---------------------------------------------------------------------------------
    def is_ring_request(self, scenario: Scenario, request_id: int) -> bool:
        return in_ring_class(scenario.seed, request_id, self.ring_share)

    @property
    def link_spec(self) -> Link:
        return link_by_name(self.ring_link)

    def model(self, scenario: Scenario) -> RingPrefill:
        """What the model says a ring request's prefill takes (model seconds)."""
        return ring_prefill(scenario.model_spec, scenario.device_spec, self.link_spec, self.ring_ranks,
                            self.ring_prompt)

    def layout(self, scenario: Scenario) -> KvLayout:
        """A ring block's layout at scale: the run's KV channels, fewer when the ring's n ranks, all sending at once,
        would push more than HOST_BUDGET_BPS through this host at the run's dilation (flows/ring/run.py's budget); at
        least one channel (then only more dilation helps, and the ring's fidelity check says so)."""
        model = scenario.model_spec
        per_channel_Bps = self.link_spec.bandwidth_Bps / model.kv_dim / scenario.effective_dilation
        fits = max(1, math.floor(HOST_BUDGET_BPS / (self.ring_ranks * per_channel_Bps)))
        return scaled_layout(model, min(scenario.kv_layout.channels, fits))

    def scale(self, scenario: Scenario) -> float:
        """A ring block's bytes over the model's block bytes (channels at scale / kv_dim)."""
        return self.layout(scenario).channels / scenario.model_spec.kv_dim

    def scaled_link(self, scenario: Scenario) -> Link:
        """The ring link as the emulation shapes it: a block is cut by `scale` along its channels
        (model/kv_scale.py), so the rate is too; ÷ dilation, latency × dilation."""
        link, dilation = self.link_spec, scenario.effective_dilation
        return Link(name=f"{link.name}@scale", bandwidth_Bps=link.bandwidth_Bps * self.scale(scenario) / dilation,
                    latency_s=link.latency_s * dilation, pj_per_bit=link.pj_per_bit)

    # -- the serving decisions' questions ---------------------------------------------------------------------
    def twin_gap(self, scenario: Scenario) -> str | None:
        """Nothing: a ring request is a step of its own (`runs_alone`) planned by the ring's model (`prefill_step`), and
        its prompt is the ring class's (`shape_requests`); its hops cross the ring's own links, not the hand-off's."""
        return None

    def runs_alone(self, scenario: Scenario, request_id: int) -> bool:
        return self.is_ring_request(scenario, request_id)

    def prefill_step(self, scenario: Scenario, entries: Sequence[BatchEntry]) -> PrefillStepPlan | None:
        """A ring request's step (a batch of its own): the rest of its prompt held by the prefill, then the ring's
        attention, which the ring's ranks run live; its energy is its whole prompt's work over the ring's GPUs."""
        from kvtransit.model.serving.prefill_plan import PrefillStepPlan

        if not any(isinstance(e.request_id, int) and self.is_ring_request(scenario, e.request_id) for e in entries):
            return None
        if len(entries) != 1:
            raise ConfigError(f"a ring request runs in a step of its own, got a batch of {len(entries)}")
        if entries[0].prompt_tokens != self.ring_prompt:
            raise ConfigError(f"request {entries[0].request_id}: a ring request's prompt is ring_prompt "
                              f"({self.ring_prompt}) tokens, got {entries[0].prompt_tokens}")
        ring = self.model(scenario)
        energy_j = step_energy_j(scenario.device_spec,
                                 prefill_work_cached(scenario.model_spec, [(entries[0].prompt_tokens, 0)]))
        return PrefillStepPlan(tuple(entries), ring.total_s, scenario.wall_s(ring.total_s), energy_j, extra=ring)

    def prefill_seconds(self, scenario: Scenario, request: RequestSpec) -> float | None:
        """A ring request holds its instance for its whole ring prefill, in a step of its own."""
        return self.model(scenario).total_s if self.is_ring_request(scenario, request.request_id) else None

    def shape_requests(self, scenario: Scenario, specs: list[RequestSpec]) -> list[RequestSpec]:
        """The ring class's requests with their long prompt: the load generator sends what the prefill will ring."""
        return with_ring_prompts(specs, scenario.seed, self.ring_share, self.ring_prompt)


SECTION = RingSection
