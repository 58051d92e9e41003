"""The twin's clock: virtual seconds that jump from one event to the next (as trio's MockClock jumps when every task
sleeps), and the queue of what happens when.

Events at the same instant run in the order they were scheduled (a sequence number breaks ties), so the run is a
function of its scenario alone: the live system's FIFO decisions (the link serves hand-offs in the order the prefill
released them) come out the same every time.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from kvtransit.model.errors import ConfigError


class EventQueue:
    """What happens next, on a virtual clock that starts at 0 s (the first arrival's reference)."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.events_run = 0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when_s: float, action: Callable[[], None]) -> None:
        """Run `action` at `when_s` (never before now: the past cannot be scheduled)."""
        if when_s < self.now_s:
            raise ConfigError(f"twin: an event at {when_s!r} s is before now ({self.now_s!r} s)")
        heapq.heappush(self._heap, (when_s, next(self._order), action))

    def run(self, max_events: int = 50_000_000) -> None:
        """Run every event in time order, those they schedule included, until none is left."""
        while self._heap:
            when_s, _, action = heapq.heappop(self._heap)
            self.now_s = when_s
            action()
            self.events_run += 1
            if self.events_run > max_events:
                raise ConfigError(f"twin: more than {max_events} events; the scenario does not settle")
