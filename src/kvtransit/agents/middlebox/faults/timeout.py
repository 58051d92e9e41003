"""timeout: stop every write (the link goes silent: a link down, a hung peer). With `timeout_s` > 0 the
connection is then dropped after that long, as toxiproxy's timeout does; with 0 the writes hang until the
fault is removed, and then go through as if the link came back up (TCP would have retransmitted them)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import ClassVar

from kvtransit.agents.middlebox.faults.base import Fault, NextWrite, ParamRanges
from kvtransit.runtime.clock import Clock, sleep_for
from kvtransit.runtime.transport import Endpoint, Part

MAX_S = 3600.0


class Timeout(Fault):
    kind = "timeout"
    params: ClassVar[ParamRanges] = {"timeout_s": (0.0, 0.0, MAX_S)}
    timeout_s: float

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(name, values, clock=clock)
        self._removed = asyncio.Event()

    def close(self) -> None:
        self._removed.set()

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        if self.timeout_s > 0:
            await self._removed_or_expired()
            if not self._removed.is_set():
                endpoint.abort()
                raise ConnectionResetError(f"fault {self.name!r}: connection timed out after {self.timeout_s} s")
        else:
            await self._removed.wait()
        await next_write(parts)

    async def _removed_or_expired(self) -> None:
        """Wait until the fault is removed or `timeout_s` has passed on the clock, whichever comes first."""
        removed = asyncio.ensure_future(self._removed.wait())
        expired = asyncio.ensure_future(sleep_for(self.clock, self.timeout_s))
        try:
            await asyncio.wait((removed, expired), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (removed, expired):
                waiter.cancel()
