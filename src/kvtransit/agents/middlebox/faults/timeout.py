"""timeout: stop every write (the link goes silent: a link down, a hung peer). With `timeout_s` > 0 the
connection is then dropped after that long, as toxiproxy's timeout does; with 0 the writes hang until the
fault is removed, and then go through as if the link came back up (TCP would have retransmitted them)."""

from __future__ import annotations

import asyncio
import contextlib

from .base import Fault

MAX_S = 3600.0


class Timeout(Fault):
    kind = "timeout"
    params = {"timeout_s": (0.0, 0.0, MAX_S)}

    def __init__(self, name: str, **values) -> None:
        super().__init__(name, **values)
        self._removed = asyncio.Event()

    def close(self) -> None:
        self._removed.set()

    async def write(self, parts, next_write, endpoint) -> None:
        if self.timeout_s > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._removed.wait(), self.timeout_s)
            if not self._removed.is_set():
                endpoint.abort()
                raise ConnectionResetError(f"fault {self.name!r}: connection timed out after {self.timeout_s} s")
        else:
            await self._removed.wait()
        await next_write(parts)
