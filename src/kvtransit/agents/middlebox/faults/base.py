"""What every fault is: a name, validated parameters, a write hook and an optional frame hook.

A fault that holds writes for a time waits on the clock the middlebox gives its faults (`self.clock`,
runtime.clock; `Middlebox.fault_clock`), so its timing is tested on a ManualClock without sleeping."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar

from kvtransit.model.errors import ConfigError
from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.runtime.transport import Endpoint, Part

ParamRanges = dict[str, tuple[float, float, float]]
"""parameter -> (default, minimum, maximum); every parameter is a finite number in range."""

NextWrite = Callable[[Sequence[Part]], Awaitable[None]]
"""The rest of the write path after a fault: the next fault's hook, or the endpoint's own write."""


class Fault:
    """A subclass names its `kind` and its `params`, and declares each parameter as a float instance
    attribute (`latency_s: float`): `__init__` sets them from the API body, validated against `params`."""

    kind: ClassVar[str] = "fault"
    params: ClassVar[ParamRanges] = {}

    def __init__(self, name: str, values: dict | None = None, *, clock: Clock | None = None) -> None:
        """`values`: the parameters by name (the API body without "type"); the rest take their default."""
        values = values or {}
        self.name = name
        # Alone, a fault waits without the yield-spin (spin_s=0): a fault's hold needs no sub-ms precision and
        # must not keep a core busy (as Middlebox.fault_clock).
        self.clock: Clock = clock if clock is not None else MonotonicClock(spin_s=0.0)
        unknown = sorted(set(values) - set(self.params))
        if unknown:
            raise ConfigError(f"fault {name!r} ({self.kind}): unknown parameter {unknown[0]!r} "
                              f"(parameters: {', '.join(self.params) or 'none'})")
        for param, (default, low, high) in self.params.items():
            value = values.get(param, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high:
                raise ConfigError(f"fault {name!r} ({self.kind}): {param} must be a number in [{low}, {high}], "
                                  f"got {value!r}")
            setattr(self, param, value)

    def describe(self) -> dict:
        return {"name": self.name, "type": self.kind, **{p: getattr(self, p) for p in self.params}}

    def frame(self, event: object, parts: Sequence[Part]) -> Sequence[Part]:
        """Called with each frame's bytes right after encoding (CRCs computed). Default: unchanged."""
        return parts

    async def write(self, parts: Sequence[Part], next_write: NextWrite, endpoint: Endpoint) -> None:
        await next_write(parts)

    def close(self) -> None:
        """The fault was removed (or replaced): release anything it holds back."""


def nbytes(parts: Sequence[Part]) -> int:
    return sum(memoryview(p).nbytes for p in parts)
