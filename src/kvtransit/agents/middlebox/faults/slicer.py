"""slicer: cut every write into small pieces (about `average_bytes` ± `size_variation_bytes`), `delay_s`
apart: the receiver sees frames arrive in many short reads, split anywhere (its parser must not care)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from kvtransit.agents.middlebox.faults.base import Fault, NextWrite, ParamRanges
from kvtransit.runtime.clock import Clock, sleep_for
from kvtransit.runtime.transport import Endpoint, Part

MAX_BYTES = float(1 << 24)


class Slicer(Fault):
    kind = "slicer"
    params: ClassVar[ParamRanges] = {"average_bytes": (1024, 1, MAX_BYTES),
                                     "size_variation_bytes": (512, 0, MAX_BYTES),
                                     "delay_s": (0.0, 0.0, 1.0)}
    average_bytes: float
    size_variation_bytes: float
    delay_s: float

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(name, values, clock=clock)
        self._rng = random.Random(name)

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        for part in parts:
            view = memoryview(part).cast("B")
            start = 0
            while start < len(view):
                size = max(1, int(self.average_bytes + self._rng.uniform(-1, 1) * self.size_variation_bytes))
                await next_write([bytes(view[start:start + size])])
                start += size
                if self.delay_s:
                    await sleep_for(self.clock, self.delay_s)
