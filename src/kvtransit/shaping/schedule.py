"""Time-varying links: a piecewise schedule of [t, rate, latency, loss], and Mahimahi traces turned into one.

Schedule text, one step per line (blank lines and '#' comments ignored), times from the schedule's start:

    # t     rate      latency  loss%
    0       200mbit   5ms      0
    2.5s    50mbit    20ms     1

Mahimahi delivery traces (mahimahi.mit.edu, mm-link): one integer per line, the millisecond at which one
MTU-sized packet (1500 bytes) may be delivered; the trace repeats. parse_mahimahi bins those opportunities
into steps of `bin_s` seconds with the rate each bin delivers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.units import parse_rate, parse_time

MAHIMAHI_PACKET_BYTES = 1500  # mm-link: each line is one delivery opportunity for an MTU-sized packet


@dataclass(frozen=True)
class Step:
    t_s: float
    rate_Bps: float
    latency_s: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.t_s) and self.t_s >= 0):
            raise ShapingError("t_s", self.t_s, "must be >= 0")
        if not (math.isfinite(self.rate_Bps) and self.rate_Bps > 0):
            raise ShapingError("rate_Bps", self.rate_Bps, f"must be > 0 (step at t={self.t_s:g} s)")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ShapingError("latency_s", self.latency_s, f"must be >= 0 (step at t={self.t_s:g} s)")
        if not 0 <= self.loss_pct <= 100:
            raise ShapingError("loss_pct", self.loss_pct, f"must be in [0, 100] (step at t={self.t_s:g} s)")


@dataclass(frozen=True)
class Schedule:
    steps: tuple[Step, ...]
    period_s: float | None = None  # repeat after this long (Mahimahi traces loop); None = hold the last step

    def __post_init__(self) -> None:
        if not self.steps:
            raise ShapingError("schedule", "", "has no steps")
        if self.steps[0].t_s != 0:
            raise ShapingError("schedule", self.steps[0].t_s, "first step must start at t=0")
        for before, after in itertools.pairwise(self.steps):
            if after.t_s <= before.t_s:
                raise ShapingError("schedule", after.t_s, f"step times must increase (after {before.t_s:g})")
        if self.period_s is not None and self.period_s <= self.steps[-1].t_s:
            raise ShapingError("period_s", self.period_s, "must be after the last step")

    def at(self, t_s: float) -> Step:
        """The step in force at time t_s since the start."""
        if self.period_s is not None:
            t_s = t_s % self.period_s
        current = self.steps[0]
        for step in self.steps:
            if step.t_s > t_s:
                break
            current = step
        return current


def parse_schedule(text: str) -> Schedule:
    steps = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.replace(",", " ").split()
        if not 2 <= len(fields) <= 4:
            raise ShapingError("schedule", raw, f"line {lineno}: expected 't rate [latency [loss%]]'")
        t = float(fields[0]) if _is_number(fields[0]) else parse_time(fields[0], f"schedule line {lineno} t")
        rate = parse_rate(fields[1], f"schedule line {lineno} rate")
        latency = parse_time(fields[2], f"schedule line {lineno} latency") if len(fields) > 2 else 0.0
        loss = float(fields[3].rstrip("%")) if len(fields) > 3 else 0.0
        steps.append(Step(t, rate, latency, loss))
    return Schedule(tuple(steps))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_mahimahi(text: str, bin_s: float = 0.1, latency_s: float = 0.0) -> Schedule:
    """A Mahimahi trace as a repeating schedule: each bin's rate = opportunities x 1500 B / bin_s.

    Bins with no opportunity (an outage) get the smallest positive rate tc accepts (8 bit/s), not zero."""
    if not bin_s > 0:
        raise ShapingError("bin_s", bin_s, "must be > 0")
    times_ms: list[int] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            value = int(raw.strip())
        except ValueError:
            raise ShapingError("mahimahi trace", raw, f"line {lineno}: expected an integer millisecond") from None
        if value < 0 or (times_ms and value < times_ms[-1]):
            raise ShapingError("mahimahi trace", value, f"line {lineno}: times must be >= 0 and non-decreasing")
        times_ms.append(value)
    if not times_ms:
        raise ShapingError("mahimahi trace", "", "is empty")
    period_s = max(times_ms[-1] / 1000.0, bin_s)  # mm-link: the trace restarts after its last timestamp
    nbins = math.ceil(period_s / bin_s - 1e-9)
    counts = [0] * nbins
    for ms in times_ms:
        counts[min(int(ms / 1000.0 / bin_s), nbins - 1)] += 1
    floor_Bps = 1.0  # 8 bit/s
    steps = tuple(Step(i * bin_s, max(floor_Bps, c * MAHIMAHI_PACKET_BYTES / bin_s), latency_s) for i, c in
                  enumerate(counts))
    return Schedule(steps, period_s=nbins * bin_s if nbins * bin_s > steps[-1].t_s else None)


def play(schedule: Schedule, apply: Callable[[Step], None], *, duration_s: float,
         clock: Callable[[], float], sleep: Callable[[float], None]) -> int:
    """Apply each step at its time (absolute deadlines from the start, so sleeps never accumulate error) until
    duration_s has passed. Returns how many changes it applied."""
    start = clock()
    applied = 0
    current: Step | None = None
    boundaries = [s.t_s for s in schedule.steps]
    while True:
        elapsed = clock() - start
        if elapsed >= duration_s:
            return applied
        step = schedule.at(elapsed)
        if step != current:
            apply(step)
            applied += 1
            current = step
        # The next boundary after `elapsed`, in this period or the next.
        base = (elapsed // schedule.period_s) * schedule.period_s if schedule.period_s else 0.0
        local = elapsed - base
        nxt = next((base + b for b in boundaries if b > local), None)
        if nxt is None:
            nxt = base + schedule.period_s if schedule.period_s else duration_s
        sleep(max(0.0, min(nxt, duration_s) - (clock() - start)))
