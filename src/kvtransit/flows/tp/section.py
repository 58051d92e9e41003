"""The TP groups' part of the scenario: how an instance of `prefill_tp` or `decode_tp` > 1 GPUs all-reduces, over
which scale-up link, and whether the decode group of a mixture-of-experts model is expert-parallel.

The group sizes themselves are the core's (`Scenario.prefill_tp`, `decode_tp`: an instance's roofline runs on its N
GPUs); this flow adds what the group does between them: 2·L all-reduces a step (docs/reference.md §7), in a ring between
the ranks or through a switch that sums (`allreduce`), over `scaleup_link`; with `decode_ep` (EP = TP = decode_tp) L
all-reduces and L dispatch + combine all-to-alls (flows/tp/model.py), and of them what the live group carries for real
(flows/tp/group_step.py).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvtransit.flows.tp.group_step import live_collectives
from kvtransit.flows.tp.model import ALLREDUCE_KINDS, ALLREDUCE_RING, check_ep, check_tp, parallel_step
from kvtransit.model.catalog.links import LINKS, Link, link_by_name
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.errors import ConfigError, unknown_name
from kvtransit.model.field_checks import choice
from kvtransit.model.sections import GroupStep, Section

if TYPE_CHECKING:
    from kvtransit.model.cost.roofline import StepWork
    from kvtransit.model.scenario import Scenario

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class TpSection(Section):
    FLOW: ClassVar[str] = "tp"
    HELP: ClassVar[dict[str, str]] = {
        "allreduce": "how a TP group all-reduces: ring (between the ranks) or switch (a switch process sums in the "
                     "network)",
        "scaleup_link": "the TP groups' link between their GPUs (nvlink3, nvlink4, nvlink5, ...)",
        "decode_ep": "the decode group of a mixture-of-experts model as EP = TP = --decode-tp: an all-to-all a step "
                     "too (ring only)",
    }

    allreduce: str = ALLREDUCE_RING
    scaleup_link: str = "nvlink4"
    decode_ep: bool = False

    def __post_init__(self) -> None:
        choice("allreduce", self.allreduce, ALLREDUCE_KINDS)
        if not isinstance(self.decode_ep, bool):
            raise ConfigError(f"decode_ep: expected yes or no (a bool), got {self.decode_ep!r}")
        if self.scaleup_link not in LINKS:
            raise ConfigError(f"scaleup_link: {unknown_name('link', self.scaleup_link, LINKS)}")

    def enabled(self, scenario: Scenario) -> bool:
        return scenario.prefill_tp > 1 or scenario.decode_tp > 1

    def check(self, scenario: Scenario) -> None:
        for name in ("decode_tp", "prefill_tp"):
            if getattr(scenario, name) > 1:
                try:
                    check_tp(scenario.model_spec, getattr(scenario, name))
                except ConfigError as exc:
                    raise ConfigError(f"{name}: {exc}") from None
        if not self.decode_ep:
            return
        if scenario.decode_tp == 1:
            raise ConfigError("decode_ep: expert parallelism needs a decode group: give --decode-tp N (EP = TP = N)")
        if scenario.model_spec.experts < 2:
            moe = ", ".join(name for name, spec in MODELS.items() if spec.experts > 1)
            raise ConfigError(f"decode_ep: expert parallelism needs a mixture-of-experts model; {scenario.model} is "
                              f"dense (valid models: {moe})")
        try:
            check_ep(scenario.model_spec, scenario.decode_tp)
        except ConfigError as exc:
            raise ConfigError(f"decode_ep: {exc}") from None
        if self.allreduce != ALLREDUCE_RING:
            raise ConfigError("decode_ep: the all-to-all goes between the ranks, a ring: --allreduce ring "
                              "(valid: ring)")

    @staticmethod
    def size(scenario: Scenario, role: str) -> int:
        """`role`'s instance's group size (1: no group)."""
        return scenario.prefill_tp if role == "prefill" else scenario.decode_tp

    @property
    def link_spec(self) -> Link:
        """The groups' link between their GPUs (unscaled)."""
        return link_by_name(self.scaleup_link)

    def scaled_link(self, scenario: Scenario) -> Link:
        """The scale-up link as the emulation shapes it: its activations are cut by the same effective scale as the
        KV (flows/tp/group_step.py), so the rate is too; ÷ dilation."""
        link, dilation = self.link_spec, scenario.effective_dilation
        return Link(name=f"{link.name}@scale",
                    bandwidth_Bps=link.bandwidth_Bps * scenario.effective_scale / dilation,
                    latency_s=link.latency_s * dilation, pj_per_bit=link.pj_per_bit)

    def twin_gap(self, scenario: Scenario) -> str | None:
        """Nothing: a group changes its instance's step alone (`group_step`: the shard's roofline and its collectives),
        which the twin plans as the agents do."""
        return None

    def group_step(self, scenario: Scenario, role: str, work: StepWork, tokens: int) -> GroupStep | None:
        """The shard's roofline, then the step's collectives: 2·L all-reduces of its tokens' activations (dense), or
        with EP L all-reduces and L all-to-alls of the decode batch's (the busiest rank's experts touched)."""
        n = self.size(scenario, role)
        if n == 1:
            return None
        ep = n if role == "decode" and self.decode_ep else 0
        step = parallel_step(scenario.model_spec, scenario.device_spec, work, max(1, tokens), self.link_spec, tp=n,
                             ep=ep, allreduce=self.allreduce, module=scenario.module)
        return GroupStep(step.total_s, step.collective_s, live_collectives(scenario, self, n, step))


SECTION = TpSection
