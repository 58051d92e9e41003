"""reset_peer: after `after_bytes` more bytes on a connection, reset it (TCP RST: abort, unwritten data
dropped), like a peer or middlebox crashing mid-transfer. Every connection is reset while the fault is on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from kvtransit.runtime.clock import Clock
from kvtransit.runtime.transport import Endpoint, Part

from .base import Fault, NextWrite, ParamRanges, nbytes

MAX_BYTES = float(1 << 40)


class ResetPeer(Fault):
    kind = "reset_peer"
    params: ClassVar[ParamRanges] = {"after_bytes": (0, 0, MAX_BYTES)}
    after_bytes: float

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(name, values, clock=clock)
        self._seen: dict[int, int] = {}  # id(endpoint) -> bytes passed on it

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        passed = self._seen.get(id(endpoint), 0)
        if passed >= self.after_bytes:
            self._seen.pop(id(endpoint), None)
            endpoint.abort()
            raise ConnectionResetError(f"fault {self.name!r}: connection reset after {int(passed)} bytes")
        self._seen[id(endpoint)] = passed + nbytes(parts)
        await next_write(parts)
