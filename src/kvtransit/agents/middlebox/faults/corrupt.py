"""corrupt: flip one bit in a KV chunk's payload, with probability `probability` per chunk, AFTER the frame's
CRC32C was computed: the bytes on the wire no longer match their CRC, so the next hop's check must catch it
(decode drops the connection with PAYLOAD_CRC_MISMATCH; nothing corrupted is ever used)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from kvtransit.agents.middlebox.faults.base import Fault, ParamRanges
from kvtransit.runtime.clock import Clock
from kvtransit.runtime.transport import Part
from kvtransit.wire.events import KvChunk


class Corrupt(Fault):
    kind = "corrupt"
    params: ClassVar[ParamRanges] = {"probability": (1.0, 0.0, 1.0), "seed": (0, 0, 2**32)}
    probability: float
    seed: float

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(name, values, clock=clock)
        self._rng = random.Random(int(self.seed))
        self.corrupted = 0

    def describe(self) -> dict:
        return {**super().describe(), "corrupted": self.corrupted}

    def frame(self, event: object, parts: Sequence[Part]) -> Sequence[Part]:
        if not isinstance(event, KvChunk) or len(parts) < 2 or self._rng.random() >= self.probability:
            return parts
        payload = bytearray(parts[-1])  # our own copy: the original belongs to the chunk (and its CRC)
        if not payload:
            return parts
        bit = self._rng.randrange(len(payload) * 8)
        payload[bit // 8] ^= 1 << (bit % 8)
        self.corrupted += 1
        return [*parts[:-1], bytes(payload)]
