"""reset_peer: after `after_bytes` more bytes on a connection, and no sooner than `after_s` after the fault was
added, reset it (TCP RST: abort, unwritten data dropped), like a peer or middlebox crashing mid-transfer. Every
connection is reset while the fault is on. (`after_s` is toxiproxy's reset_peer `timeout`: the reset comes that
long after the toxic was added.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from kvtransit.agents.middlebox.faults.base import Fault, NextWrite, ParamRanges, nbytes
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.transport import Endpoint, Part

MAX_BYTES = float(1 << 40)
MAX_S = 3600.0


class ResetPeer(Fault):
    kind = "reset_peer"
    params: ClassVar[ParamRanges] = {"after_bytes": (0, 0, MAX_BYTES), "after_s": (0.0, 0.0, MAX_S)}
    after_bytes: float
    after_s: float

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(name, values, clock=clock)
        self._seen: dict[int, int] = {}  # id(endpoint) -> bytes passed on it
        self._armed_ns = self.clock.now_ns() + round(self.after_s * 1e9)

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        passed = self._seen.get(id(endpoint), 0)
        if passed >= self.after_bytes and self.clock.now_ns() >= self._armed_ns:
            self._seen.pop(id(endpoint), None)
            endpoint.abort()
            raise ConnectionResetError(f"fault {self.name!r}: connection reset after {int(passed)} bytes")
        self._seen[id(endpoint)] = passed + nbytes(parts)
        await next_write(parts)
