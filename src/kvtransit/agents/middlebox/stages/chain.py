"""The stage chain as data: stage kinds registered by name, a chain built from a declaration of names.

    DEFAULT_CHAIN = ("kernel", "module", "link")

kernel (the codec on the bytes) → module (what the optics charge for them) → link (FIFO channels, token
bucket, delay line). `GET /chain` is `describe()`; `PUT /kernel` and `PUT /link` are `reconfigure(name,
update)` on the stage of that name. The middlebox needs all three (it charges the module and paces on the
link), in that order: the module prices the kernel's output, and the link is where a stream leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.agents.middlebox.stages.base import Stage
from kvtransit.agents.middlebox.stages.kernel import ActiveKernel, KernelConfig, KernelStage
from kvtransit.agents.middlebox.stages.link import LINK_BACKENDS, LinkStage
from kvtransit.agents.middlebox.stages.module import ModuleStage
from kvtransit.model.catalog.links import Link
from kvtransit.model.errors import ConfigError, unknown_name
from kvtransit.model.module.budget import Module, Policy
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.egress import TransferRecord

STAGE_KINDS: dict[str, type[Stage]] = {cls.name: cls for cls in (KernelStage, ModuleStage, LinkStage)}
DEFAULT_CHAIN = ("kernel", "module", "link")

S = TypeVar("S", bound=Stage)


@dataclass(frozen=True)
class ChainSettings:
    """Everything a stage kind may draw on when it is built, taken once from the run's scenario."""

    kernel: KernelConfig  # the kernel to start with
    module: Module
    policy: Policy
    kernel_threads: int
    shaped_link: Link  # what is shaped: the scaled rate, the dilated latency
    model_link: Link  # what is modelled (docs/reference.md §2), for energy and reports
    module_latency_s: float  # the module's added latency, dilated: it rides on the link's delay line
    dilation: float
    model_bytes_per_byte: float  # 1 / payload scale: energy and ops are reported for the modelled KV
    channels: int
    link_backend: str  # "userspace" (our token bucket shapes the rate) or "tc" (the kernel's qdisc does)
    clock: Clock
    on_transfer_done: Callable[[TransferRecord], None] | None = None

    def __post_init__(self) -> None:
        # Checked here, the one place, before any stage is built (the link stage takes it as given).
        if self.link_backend not in LINK_BACKENDS:
            raise ConfigError(f"unknown link backend {self.link_backend!r} "
                              f"(choose from: {', '.join(LINK_BACKENDS)})")

    @classmethod
    def from_scenario(cls, scenario: Scenario, *, link_backend: str, kernel_threads: int, clock: Clock,
                      on_transfer_done: Callable[[TransferRecord], None] | None = None) -> ChainSettings:
        dilation = scenario.effective_dilation
        # --compress-at gpu: the prefill already ran the codec; the module passes its bytes through.
        codec = "none" if scenario.compress_at == "gpu" else scenario.codec
        # The module's unknowns come from the scenario (docs/reference.md §5), so a run honours them from its start;
        # `PUT /kernel` can still change the kernel's live.
        kernel = KernelConfig(codec=codec, keep=scenario.keep, block=scenario.block, sinks=scenario.sinks,
                              variant=scenario.variant, precision_bits=scenario.precision_bits,
                              transform_charged=scenario.transform_charged, placement=scenario.placement)
        module = scenario.module  # ops per line byte, pJ per input bit, added latency
        return cls(kernel=kernel, module=module, policy=Policy(scenario.policy),
                   kernel_threads=kernel_threads, shaped_link=scenario.scaled_link, model_link=scenario.link_spec,
                   module_latency_s=module.added_latency_s * dilation, dilation=dilation,
                   model_bytes_per_byte=1.0 / scenario.effective_scale, channels=scenario.channels,
                   link_backend=link_backend, clock=clock, on_transfer_done=on_transfer_done)


class StageChain:
    """The middlebox's stages, in order, by name."""

    def __init__(self, stages: Sequence[Stage]):
        names = [stage.name for stage in stages]
        required = [name for name in names if name in DEFAULT_CHAIN]
        if required != list(DEFAULT_CHAIN) or len(set(names)) != len(names) or names[-1] != "link":
            raise ConfigError(f"stage chain {' → '.join(names) or '(empty)'}: the middlebox needs "
                              f"{' → '.join(DEFAULT_CHAIN)}, each once, in that order, the link last")
        self._stages = {stage.name: stage for stage in stages}

    @classmethod
    def build(cls, settings: ChainSettings, declaration: Sequence[str] = DEFAULT_CHAIN) -> StageChain:
        """One stage of each kind `declaration` names, in its order (ConfigError for an unknown kind)."""
        for name in declaration:
            if name not in STAGE_KINDS:
                raise unknown_name("stage", name, STAGE_KINDS)
        return cls([STAGE_KINDS[name].from_settings(settings) for name in declaration])

    def __iter__(self) -> Iterator[Stage]:
        return iter(self._stages.values())

    def __getitem__(self, name: str) -> Stage:
        stage = self._stages.get(name)
        if stage is None:
            raise unknown_name("stage", name, self._stages)
        return stage

    def _typed(self, name: str, kind: type[S]) -> S:
        stage = self[name]
        assert isinstance(stage, kind), stage
        return stage

    @property
    def kernel(self) -> KernelStage:
        return self._typed("kernel", KernelStage)

    @property
    def module(self) -> ModuleStage:
        return self._typed("module", ModuleStage)

    @property
    def link(self) -> LinkStage:
        return self._typed("link", LinkStage)

    def describe(self) -> list[dict]:
        """`GET /chain`: each stage's settings, in order."""
        return [stage.describe() for stage in self]

    def reconfigure(self, name: str, update: dict) -> None:
        """A live change to the stage `name` (ConfigError if refused; the chain is then unchanged)."""
        self[name].reconfigure(update)

    async def run(self, item: ChunkInFlight, kernel: ActiveKernel) -> ChunkInFlight:
        """One chunk down every stage, in order, with the kernel its stream started with."""
        for stage in self:
            item = await stage.process(item, kernel)
        return item

    def close(self) -> None:
        for stage in self:
            stage.close()
