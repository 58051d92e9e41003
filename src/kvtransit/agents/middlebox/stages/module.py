"""Module stage: what the optics would charge for each chunk (docs/reference.md §5).

No host work happens here; the stage prices the chunk: operations against the module's budget, the
modelled compute time `ops / (ops_per_line_byte × link_bw)` (which the link stage turns into a minimum
occupancy, so a hand-off takes `max(wire / bw, ops / (budget × bw))`), and the energy of the input bits: on a
hand-off, of both module stages, this one's and the decoding module's at decode's end (`handoff_energy_j`).
Only chunks the kernel ran on *in the module* are charged; a host or GPU placement costs the module nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.agents.middlebox.stages.base import Stage
from kvtransit.agents.middlebox.stages.kernel import RUNS_ON_MODULE, ActiveKernel
from kvtransit.model.cost.energy import handoff_module_energy_j
from kvtransit.model.module.budget import Module

if TYPE_CHECKING:
    from kvtransit.agents.middlebox.stages.chain import ChainSettings


class ModuleStage(Stage):
    name = "module"

    def __init__(self, module: Module, *, link_rate_Bps: float, model_bytes_per_byte: float):
        """`link_rate_Bps`: the shaped (scaled, dilated) rate; `model_bytes_per_byte`: 1 / payload scale, so
        energy is reported for the modelled bytes, not the scaled-down ones."""
        self.module = module
        self.link_rate_Bps = link_rate_Bps
        self.model_bytes_per_byte = model_bytes_per_byte

    @classmethod
    def from_settings(cls, settings: ChainSettings) -> ModuleStage:
        return cls(settings.module, link_rate_Bps=settings.shaped_link.bandwidth_Bps,
                   model_bytes_per_byte=settings.model_bytes_per_byte)

    def describe(self) -> dict:
        m = self.module
        return {"stage": self.name, "module": m.name, "line_rate_Bps": m.line_rate_Bps,
                "ops_per_byte_budget": m.ops_per_byte, "pj_per_input_bit": m.pj_per_input_bit,
                "added_latency_s": m.added_latency_s}

    async def process(self, item: ChunkInFlight, kernel: ActiveKernel) -> ChunkInFlight:
        return self.price(item, kernel)

    def price(self, item: ChunkInFlight, kernel: ActiveKernel) -> ChunkInFlight:
        """Charge `item` to the module: ops, modelled compute time, transit-bound or not. Pure arithmetic, so
        the pool path also uses it for the inverse transform on a fetch."""
        if item.runs_on != RUNS_ON_MODULE or kernel.declaration is None:
            return item
        ops = item.raw_bytes * kernel.declaration.charged_ops_per_byte
        item.module_ops = ops * self.model_bytes_per_byte
        item.modelled_compute_s = ops / (self.module.ops_per_byte * self.link_rate_Bps)
        item.transit_bound = item.modelled_compute_s > item.wire_bytes / self.link_rate_Bps
        return item

    def energy_j(self, item: ChunkInFlight) -> float:
        """This module's stage energy = input bits × pJ per input bit, for the modelled bytes (docs/reference.md §5).
        One stage: the pool path charges its encode (put) and its decode (fetch) each as a stage of its own."""
        if item.runs_on != RUNS_ON_MODULE:
            return 0.0
        return self.module.energy_j(item.raw_bytes * self.model_bytes_per_byte)

    def handoff_energy_j(self, item: ChunkInFlight) -> float:
        """A hand-off chunk's module energy at both ends of the link: this module's input bits plus the wire
        bits the decoding module at decode's end takes in (model.energy.handoff_module_energy_j, the formula
        the model's hand-off estimate uses; its time is pipelined with this stage's, so it adds none)."""
        if item.runs_on != RUNS_ON_MODULE:
            return 0.0
        scale = self.model_bytes_per_byte
        return handoff_module_energy_j(self.module, item.raw_bytes * scale, item.wire_bytes * scale)
