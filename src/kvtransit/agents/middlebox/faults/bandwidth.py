"""bandwidth: cap the writes to decode at `rate_Bps` (a token bucket with no burst), on top of the link's own
shaping: a rate collapse without touching the link's configuration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from kvtransit.agents.middlebox.faults.base import Fault, NextWrite, ParamRanges, nbytes
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.transport import Endpoint, Part

MAX_RATE = 1e12


class Bandwidth(Fault):
    kind = "bandwidth"
    params: ClassVar[ParamRanges] = {"rate_Bps": (1e6, 1.0, MAX_RATE)}
    rate_Bps: float

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(name, values, clock=clock)
        self._next_free_ns = 0  # when the capped "wire" has finished the bytes already let through

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        start_ns = max(self.clock.now_ns(), self._next_free_ns)
        self._next_free_ns = start_ns + round(nbytes(parts) / self.rate_Bps * 1e9)
        # Hold until these bytes would have finished serialising at the capped rate.
        await self.clock.sleep_until(self._next_free_ns)
        await next_write(parts)
