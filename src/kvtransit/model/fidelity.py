"""The fidelity guard's judgement (DESIGN §2): did the host emulate what the scenario asked of it?

The agents measure three gaps; this module judges them and says what would fix each:
- **timer lateness**: how late the step loops woke past their absolute deadlines. Steps are scheduled on
  absolute deadlines, so a late wake-up shifts that one token and is not carried into the next: what biases
  the measured ITL, TPOT and E2E is the *mean* lateness, which must stay within `TIMER_TOLERANCE` of the
  shortest modelled step held (the TPOT target is 3 %). The p99 (a single slow wake-up on a loaded box) is
  reported beside it, not judged. Fix: dilate time (longer steps, same lateness).
- **link rate**: achieved rate while the link was busy vs the configured (scaled) rate. Below
  `LINK_RATE_TOLERANCE` the hand-off runs slow (the hand-off target is 2 %). Fix: a smaller scale (fewer bytes
  per modelled second) or more dilation.
- **kernel time**: the codec's real compute time vs the module's modelled time for the same bytes (the link
  time of those bytes at the scaled rate). A kernel slower than that holds the stream back. Fix: a smaller scale
  or more dilation.

Pure: numbers in, a verdict out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

# The fidelity targets: TPOT within 3 % of the roofline step, hand-off within 2 % (or 1 ms).
TIMER_TOLERANCE = 0.03
LINK_RATE_TOLERANCE = 0.02
HANDOFF_ABS_TOLERANCE_S = 1e-3
# A kernel may take this share of the link time of its bytes and still keep up (it overlaps with the send).
KERNEL_TOLERANCE = 1.0


@dataclass(frozen=True)
class Gap:
    measured: float
    target: float
    ok: bool
    hint: str

    def as_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "target": self.target, "ok": self.ok, "hint": self.hint}


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def lateness_p99(lateness_s: Sequence[float]) -> float | None:
    """The p99 of timer lateness samples (None when there are none)."""
    return _quantile(lateness_s, 0.99) if lateness_s else None


def lateness_mean(lateness_s: Sequence[float]) -> float | None:
    """The mean of timer lateness samples (None when there are none)."""
    return sum(lateness_s) / len(lateness_s) if lateness_s else None


def timer_gap(mean_lateness_s: float | None, shortest_step_wall_s: float, dilation: float) -> Gap:
    """Mean timer lateness as a share of the shortest step held on the wall clock."""
    if mean_lateness_s is None:
        return Gap(0.0, TIMER_TOLERANCE, True, "no timed steps")
    if not shortest_step_wall_s > 0:
        raise ConfigError(f"shortest step must be > 0 s, got {shortest_step_wall_s!r}")
    share = max(0.0, mean_lateness_s) / shortest_step_wall_s
    ok = share <= TIMER_TOLERANCE
    needed = dilation * share / TIMER_TOLERANCE
    hint = "ok" if ok else f"timers late by {share:.1%} of a step: try --dilation {math.ceil(needed * 10) / 10:g}"
    return Gap(share, TIMER_TOLERANCE, ok, hint)


def link_gap(achieved_Bps: float, configured_Bps: float, scale: float, dilation: float) -> Gap:
    """Shortfall of the achieved busy-time link rate below the configured one (0 = exact)."""
    if not configured_Bps > 0:
        raise ConfigError(f"configured link rate must be > 0, got {configured_Bps!r}")
    if not achieved_Bps > 0:
        return Gap(math.nan, LINK_RATE_TOLERANCE, True, "the link carried nothing")
    shortfall = max(0.0, 1.0 - achieved_Bps / configured_Bps)
    ok = shortfall <= LINK_RATE_TOLERANCE
    fix = achieved_Bps / configured_Bps * (1 - LINK_RATE_TOLERANCE)
    hint = "ok" if ok else (
        f"link reached {achieved_Bps / configured_Bps:.1%} of its rate: try --scale {scale * fix:.4g} "
        f"or --dilation {math.ceil(dilation / fix * 10) / 10:g}"
    )
    return Gap(shortfall, LINK_RATE_TOLERANCE, ok, hint)


def kernel_gap(kernel_s: float, modelled_s: float, scale: float, dilation: float) -> Gap:
    """Real kernel compute time over the modelled time of the same bytes (≤ 1 keeps up with the link)."""
    if not modelled_s > 0:
        return Gap(math.nan, KERNEL_TOLERANCE, True, "no kernel work")
    ratio = kernel_s / modelled_s
    ok = ratio <= KERNEL_TOLERANCE
    hint = "ok" if ok else (
        f"kernel took {ratio:.2f}x its modelled time: try --scale {scale / ratio:.4g} "
        f"or --dilation {math.ceil(dilation * ratio * 10) / 10:g}"
    )
    return Gap(ratio, KERNEL_TOLERANCE, ok, hint)


def assess(gaps: dict[str, Gap]) -> tuple[bool, dict[str, dict[str, Any]]]:
    """(`faithful`, the report's `fidelity` dict): faithful only if every measured gap is within its target."""
    return all(g.ok for g in gaps.values()), {name: g.as_dict() for name, g in gaps.items()}


def handoff_within_target(measured_s: float, modelled_s: float) -> bool:
    """The issue's hand-off target: within 2 % or 1 ms of latency + bytes / bandwidth."""
    return abs(measured_s - modelled_s) <= max(LINK_RATE_TOLERANCE * modelled_s, HANDOFF_ABS_TOLERANCE_S)
