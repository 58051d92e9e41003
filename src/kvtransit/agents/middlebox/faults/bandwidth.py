"""bandwidth: cap the writes to decode at `rate_Bps` (a token bucket with no burst), on top of the link's own
shaping: a rate collapse without touching the link's configuration."""

from __future__ import annotations

import asyncio

from .base import Fault, nbytes

MAX_RATE = 1e12


class Bandwidth(Fault):
    kind = "bandwidth"
    params = {"rate_Bps": (1e6, 1.0, MAX_RATE)}

    def __init__(self, name: str, **values) -> None:
        super().__init__(name, **values)
        self._next_free = 0.0

    async def write(self, parts, next_write, endpoint) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = max(now, self._next_free)
        self._next_free = start + nbytes(parts) / self.rate_Bps
        # Hold until these bytes would have finished serialising at the capped rate.
        await asyncio.sleep(self._next_free - now)
        await next_write(parts)
