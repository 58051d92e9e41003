"""toxicity: a fault that acts on a connection with probability `toxicity`, drawn once per connection.

toxiproxy's `toxicity` field (toxic_collection.go: each new link draws whether the toxic applies to it). The
middlebox keeps one long-lived connection per decode instance, so with one decode a toxicity of 0.5 is a coin
flip for the whole run, as it would be for one long-lived connection through toxiproxy. The draw is seeded by
the fault's name, so a run is repeatable.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvtransit.agents.middlebox.faults.base import Fault, NextWrite
from kvtransit.runtime.transport import Endpoint, Part


class PerConnection(Fault):
    """`inner`, on the connections it was drawn for (every write of the others passes untouched)."""

    def __init__(self, inner: Fault, toxicity: float):
        if not 0.0 <= toxicity <= 1.0:
            raise ValueError(f"toxicity must be in [0, 1], got {toxicity!r}")
        super().__init__(inner.name, clock=inner.clock)
        self.inner = inner
        self.toxicity = toxicity
        self._rng = random.Random(f"{inner.name}/toxicity")
        self._drawn: dict[int, bool] = {}  # id(endpoint) -> whether the fault acts on it

    def describe(self) -> dict:
        return {**self.inner.describe(), "toxicity": self.toxicity}

    def applies_to(self, endpoint: Endpoint) -> bool:
        key = id(endpoint)
        if key not in self._drawn:
            self._drawn[key] = self._rng.random() < self.toxicity
        return self._drawn[key]

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        if self.applies_to(endpoint):
            await self.inner.write(parts, next_write, endpoint)
        else:
            await next_write(parts)

    def close(self) -> None:
        self.inner.close()
