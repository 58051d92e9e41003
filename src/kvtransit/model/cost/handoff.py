"""The hand-off calculator: what moving one prompt's KV cache over a link costs (docs/reference.md §1, §2, §5).

Without a codec the KV crosses the bare link: `latency + bytes / bandwidth`. With a codec that runs in
transit, it crosses the module too: `latency + module latency + max(wire / bw, ops / (budget × bw))`
(module.transit_time), and its module energy counts both stages, the encoding module's and the decoding
one's at the far end (energy.handoff_module_energy_j; docs/reference.md §5's formula counts the first). A codec that
needs an operation the module does not publish is rejected, or runs on the host before the link (fewer bytes
on the wire, no module time or energy), by policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtransit.model.catalog.codecs import CODECS
from kvtransit.model.catalog.links import LINKS, Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.energy import handoff_module_energy_j, link_energy_j
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import (
    Action,
    BudgetResult,
    KernelDeclaration,
    Module,
    Policy,
    Verdict,
    budget_check,
    transit_time,
)

# docs/reference.md §2 hand-off oracle table: its rows (model × prompt) and its link columns, in order.
HANDOFF_TABLE_MODELS = ("llama3-8b", "llama3-70b")
HANDOFF_TABLE_PROMPTS = (2048, 32768)
HANDOFF_TABLE_LINKS = ("nvlink4", "ib-ndr", "eth-100g", "eth-25g")
# docs/reference.md §1: weights are loaded over PCIe Gen5 x16.
WEIGHT_LOAD_LINK = "pcie5"

# Where the codec ran.
NO_CODEC = "none"
IN_MODULE = "module"
ON_HOST = "host"


@dataclass(frozen=True)
class HandoffEstimate:
    model: str
    prompt_tokens: int
    link: str
    codec: str
    placement: str  # "none" (bare link), "module" (in transit) or "host" (before the link)
    kv_bytes: int
    wire_bytes: float
    transfer_s: float  # one hand-off, first byte sent to last byte received
    occupancy_s: float  # how long one hand-off keeps the link (or the module, if slower) busy
    link_energy_j: float
    module_energy_j: float  # both module stages, encode and the far end's decode (0 unless in the module)
    transit_bound: bool
    budget: BudgetResult | None  # the module's verdict on the codec; None without a codec

    @property
    def handoffs_per_s_to_fill(self) -> float:
        """Bandwidth / hand-off bytes (docs/reference.md §2); with a codec, 1 / the busier of wire and module."""
        return 1.0 / self.occupancy_s


def _is_identity(decl: KernelDeclaration) -> bool:
    return decl.ratio == 1.0 and decl.charged_ops_per_byte == 0.0 and not decl.op_types


def handoff(
    model: ModelSpec,
    prompt_tokens: int,
    link: Link,
    codec_decl: KernelDeclaration | None = None,
    module: Module = Module(),
    policy: Policy = Policy.HOST,
) -> HandoffEstimate:
    kv_bytes = model.kv_bytes(prompt_tokens)
    decl = codec_decl if codec_decl is not None else CODECS["none"]
    common: dict[str, Any] = dict(model=model.name, prompt_tokens=prompt_tokens, link=link.name, codec=decl.name,
                                  kv_bytes=kv_bytes)

    if _is_identity(decl):
        return HandoffEstimate(
            **common, placement=NO_CODEC, wire_bytes=float(kv_bytes), transfer_s=link.transfer_time_s(kv_bytes),
            occupancy_s=link.serialisation_s(kv_bytes), link_energy_j=link_energy_j(link, kv_bytes),
            module_energy_j=0.0, transit_bound=False, budget=None,
        )

    verdict = budget_check(decl, module, policy)
    wire_bytes = kv_bytes / decl.ratio
    if verdict.action is Action.REJECTED:
        if verdict.verdict is Verdict.MISPLACED:  # no policy helps: the host at one end sees one stream too
            raise ConfigError(f"codec {decl.name!r} on module {module.name!r}: {verdict.describe()}")
        ops = ", ".join(sorted(verdict.unpublished_ops))
        raise ConfigError(
            f"codec {decl.name!r} needs {ops}, which module {module.name!r} does not publish "
            f"(policy reject; choose policy host to run it on the host)"
        )
    if verdict.action is Action.ON_HOST:
        return HandoffEstimate(
            **common, placement=ON_HOST, wire_bytes=wire_bytes, transfer_s=link.transfer_time_s(wire_bytes),
            occupancy_s=link.serialisation_s(wire_bytes), link_energy_j=link_energy_j(link, wire_bytes),
            module_energy_j=0.0, transit_bound=False, budget=verdict,
        )
    timing = transit_time(kv_bytes, decl, link.bandwidth_Bps, link.latency_s, module)
    return HandoffEstimate(
        **common, placement=IN_MODULE, wire_bytes=wire_bytes, transfer_s=timing.total_s,
        occupancy_s=max(timing.wire_s, timing.compute_s), link_energy_j=link_energy_j(link, wire_bytes),
        module_energy_j=handoff_module_energy_j(module, kv_bytes, wire_bytes), transit_bound=timing.transit_bound,
        budget=verdict,
    )


def weight_load_s(model: ModelSpec, link: Link | None = None) -> float:
    """Resident BF16 weights over PCIe Gen5 x16 by default: 0.25 s for llama3-8b, 2.20 s for 70b (docs/reference.md
    §1)."""
    return (link or LINKS[WEIGHT_LOAD_LINK]).transfer_time_s(model.resident_weight_bytes)
