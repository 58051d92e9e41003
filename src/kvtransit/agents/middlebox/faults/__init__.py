"""Faults on the middlebox → decode link, toxiproxy style: one small fault per file, added and removed live.

    GET    /faults          the active faults, in order
    PUT    /faults/NAME     {"type": "latency", "latency_s": 0.05}   add or replace the fault NAME
    DELETE /faults/NAME     remove it (a hanging "timeout" fault lets its held writes go)

Each fault sees every write to decode (`write(parts, next_write, endpoint)`: pass the bytes on, later, in
pieces, or not at all) and, optionally, each frame just after it was encoded (`frame(event, parts)`: the
corrupt fault flips payload bits there, after the CRC was computed, so decode's CRC check catches it).
Faults chain in the order they were added. `FaultedEndpoint` is the middlebox's connection to a decode
instance with the chain in its write path; with no fault active it writes straight through.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kvtransit.agents.middlebox.faults.bandwidth import Bandwidth
from kvtransit.agents.middlebox.faults.base import Fault, NextWrite
from kvtransit.agents.middlebox.faults.corrupt import Corrupt
from kvtransit.agents.middlebox.faults.latency import Latency
from kvtransit.agents.middlebox.faults.limit_data import LimitData
from kvtransit.agents.middlebox.faults.reset_peer import ResetPeer
from kvtransit.agents.middlebox.faults.slicer import Slicer
from kvtransit.agents.middlebox.faults.timeout import Timeout
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.transport import Endpoint, Part
from kvtransit.runtime.transport.protocol import SansIOConnection

FAULT_TYPES: dict[str, type[Fault]] = {cls.kind: cls for cls in
                                        (Latency, Bandwidth, Slicer, Corrupt, ResetPeer, Timeout, LimitData)}
FAULT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_FAULTS = 32  # a chain this long is a mistake, not an experiment; bounds what the API can make us hold


def make_fault(name: str, body: dict, *, clock: Clock | None = None) -> Fault:
    """A fault from its API body ({"type": ..., params}); ConfigError names what was wrong. `clock`: the
    middlebox's, which a fault that holds writes waits on."""
    if not FAULT_NAME.match(name):
        raise ConfigError(f"fault name {name[:80]!r}: use 1-64 letters, digits, '_', '.', '-'")
    kind = body.get("type")
    if not isinstance(kind, str) or kind not in FAULT_TYPES:
        raise ConfigError(f"fault {name!r}: unknown type {kind!r} (choose from: {', '.join(FAULT_TYPES)})")
    params = {k: v for k, v in body.items() if k != "type"}
    return FAULT_TYPES[kind](name, params, clock=clock)


class FaultChain:
    def __init__(self) -> None:
        self._faults: dict[str, Fault] = {}

    def __bool__(self) -> bool:
        return bool(self._faults)

    def put(self, fault: Fault) -> None:
        if fault.name not in self._faults and len(self._faults) >= MAX_FAULTS:
            raise ConfigError(f"at most {MAX_FAULTS} faults at once; DELETE one first")
        old = self._faults.pop(fault.name, None)
        if old is not None:
            old.close()
        self._faults[fault.name] = fault

    def delete(self, name: str) -> bool:
        fault = self._faults.pop(name, None)
        if fault is None:
            return False
        fault.close()
        return True

    def clear(self) -> None:
        for name in list(self._faults):
            self.delete(name)

    def describe(self) -> list[dict]:
        return [fault.describe() for fault in self._faults.values()]

    def frame(self, event: object, parts: Sequence[Part]) -> Sequence[Part]:
        for fault in list(self._faults.values()):
            parts = fault.frame(event, parts)
        return parts

    async def write(self, parts: Sequence[Part], write: NextWrite, endpoint: Endpoint) -> None:
        faults = list(self._faults.values())

        def stage(i: int) -> NextWrite:
            if i == len(faults):
                return write
            return lambda p: faults[i].write(p, stage(i + 1), endpoint)

        await stage(0)(parts)


class _FramedWithFaults:
    """The sans-IO connection as the endpoint's senders see it: every frame passes the chain's frame hook."""

    def __init__(self, connection: SansIOConnection, chain: FaultChain):
        self._connection = connection
        self._chain = chain

    def send_parts(self, event: object) -> Sequence[Part]:
        parts = self._connection.send_parts(event)
        return self._chain.frame(event, parts) if self._chain else parts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


class FaultedEndpoint(Endpoint):
    """An Endpoint (same socket, same protocol object) whose writes go through a FaultChain."""

    def __init__(self, endpoint: Endpoint, chain: FaultChain):
        super().__init__(endpoint)  # takes the endpoint's connection over (Endpoint's documented way to wrap)
        self.chain = chain
        self._framed = _FramedWithFaults(endpoint.connection, chain)

    @property
    def connection(self) -> SansIOConnection:
        return self._framed

    async def write_parts(self, parts: Sequence[Part]) -> None:
        if not self.chain:
            return await super().write_parts(parts)
        await self.chain.write(parts, super().write_parts, self)


__all__ = ["FAULT_TYPES", "Fault", "FaultChain", "FaultedEndpoint", "make_fault"]
