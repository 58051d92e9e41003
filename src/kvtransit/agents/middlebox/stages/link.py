"""Link stage: the shared FIFO hand-off link (REFERENCE §4), shaped in user space.

A thin face on runtime.egress.EgressShaper: `channels` concurrent hand-offs in FIFO order, each paced by
a token bucket at the scaled link rate and released one link latency later. Rate and latency change live
(the control API). The module's added latency rides on the delay line, since it is latency, not occupancy.
"""

from __future__ import annotations

from kvtransit.model.link_catalog import Link
from kvtransit.runtime.egress import EgressShaper


class LinkStage:
    name = "link"

    def __init__(self, link: Link, shaper: EgressShaper, *, module_latency_s: float, model_link: Link,
                 dilation: float):
        self.link = link  # what is shaped (scaled rate, dilated latency)
        self.model_link = model_link  # what is modelled (REFERENCE §2), for energy and reports
        self.shaper = shaper
        self.module_latency_s = module_latency_s
        self.dilation = dilation

    def describe(self) -> dict:
        return {"stage": self.name, "link": self.model_link.name, "rate_Bps": self.shaper.rate_Bps,
                "latency_s": self.shaper.latency_s - self.module_latency_s,
                "module_latency_s": self.module_latency_s, "channels": self.shaper.channels,
                "queued": self.shaper.queued, "active": self.shaper.active}

    def set_rate(self, rate_Bps: float) -> None:
        self.shaper.set_rate(rate_Bps)

    def set_latency(self, latency_s: float, jitter_s: float | None = None) -> None:
        self.shaper.set_latency(latency_s + self.module_latency_s, jitter_s)

    def energy_j(self, wire_bytes: int, model_bytes_per_byte: float) -> float:
        """Link energy = wire bits × link pJ/bit, for the modelled bytes (REFERENCE §5)."""
        return self.model_link.energy_j(wire_bytes * model_bytes_per_byte)
