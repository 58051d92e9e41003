"""latency: hold each write `latency_s` (± uniform `jitter_s`) before passing it on.

Writes are serial, so a held write also holds the ones behind it: this is a slow, laggy peer (its rate falls
to one write per latency), not a pure delay line. For propagation delay use the link's own delay line
(`PUT /link {"latency_s": ...}`), which pipelines.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from kvtransit.agents.middlebox.faults.base import Fault, NextWrite, ParamRanges
from kvtransit.runtime.clock import Clock, sleep_for
from kvtransit.runtime.transport import Endpoint, Part

MAX_S = 60.0


class Latency(Fault):
    kind = "latency"
    params: ClassVar[ParamRanges] = {"latency_s": (0.01, 0.0, MAX_S), "jitter_s": (0.0, 0.0, MAX_S)}
    latency_s: float
    jitter_s: float

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(name, values, clock=clock)
        self._rng = random.Random(name)

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        jitter = self._rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
        await sleep_for(self.clock, max(0.0, self.latency_s + jitter))
        await next_write(parts)
