"""limit_data: let `bytes` bytes through on a connection, then drop it (loss, for a byte stream: TCP never
loses bytes, it loses the connection). Each new connection gets the allowance again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from kvtransit.agents.middlebox.faults.base import Fault, NextWrite, ParamRanges, nbytes
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.transport import Endpoint, Part

MAX_BYTES = float(1 << 40)


class LimitData(Fault):
    kind = "limit_data"
    params: ClassVar[ParamRanges] = {"bytes": (1 << 20, 0, MAX_BYTES)}
    bytes: float

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(name, values, clock=clock)
        self._passed: dict[int, int] = {}

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        passed = self._passed.get(id(endpoint), 0)
        size = nbytes(parts)
        if passed + size > self.bytes:
            self._passed.pop(id(endpoint), None)
            endpoint.abort()
            raise ConnectionResetError(f"fault {self.name!r}: connection dropped after {int(passed)} bytes "
                                       f"(limit {int(self.bytes)})")
        self._passed[id(endpoint)] = passed + size
        await next_write(parts)
