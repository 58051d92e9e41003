"""The fidelity guard's judgement (ARCHITECTURE.md, time and scale): did the host emulate what the scenario asked of
it?

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
- **hand-off vs the model**: each hand-off that found a lane of the link free, measured at the client (prefill's
  first-token stamp to decode's KV-ready stamp), over what the model prescribes for it: latency + wire bytes /
  bandwidth, plus the module's latency and compute when the codec runs in transit (docs/reference.md §2, §5). The
  median must be within `HANDOFF_REL_TOLERANCE` (or 1 ms); the distribution is reported beside it, its tail
  not judged (one late wake-up on a loaded box), as with the timers.

Fail closed: a check that could not be measured (an agent's stats missing, a meter with no samples) is a
`Gap` that is not ok, its hint saying "not measured: …", so a run is faithful only when every check ran and
passed.

Pure: numbers in, a verdict out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Action
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import (
    HANDOFF_LAYERWISE,
    layerwise_exposed_s,
    prefill_overlap_s,
    streamed_ready_s,
)

# kvtransit's fidelity targets (docs/reference.md §8.3): TPOT within 3 % of the roofline step, hand-off within 2 % (or 1
# ms).
TIMER_TOLERANCE = 0.03
LINK_RATE_TOLERANCE = 0.02
HANDOFF_REL_TOLERANCE = 0.02
HANDOFF_ABS_TOLERANCE_S = 1e-3
NOT_MEASURED = "not measured"
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


def not_measured(what: str, target: float) -> Gap:
    """A check that could not run: never a pass (fail closed)."""
    return Gap(math.nan, target, False, f"{NOT_MEASURED}: {what}")


def lateness_p99(lateness_s: Sequence[float]) -> float | None:
    """The p99 of timer lateness samples (None when there are none)."""
    return _quantile(lateness_s, 0.99) if lateness_s else None


def lateness_mean(lateness_s: Sequence[float]) -> float | None:
    """The mean of timer lateness samples (None when there are none)."""
    return sum(lateness_s) / len(lateness_s) if lateness_s else None


def step_share(mean_lateness_s: float, shortest_step_wall_s: float) -> float:
    """Mean timer lateness as a share of the shortest step held on the wall clock (what TIMER_TOLERANCE judges)."""
    return max(0.0, mean_lateness_s) / shortest_step_wall_s


def timer_gap(mean_lateness_s: float | None, shortest_step_wall_s: float, dilation: float) -> Gap:
    """Mean timer lateness as a share of the shortest step held on the wall clock."""
    if mean_lateness_s is None:
        return not_measured("no timer wake-ups", TIMER_TOLERANCE)
    if not shortest_step_wall_s > 0:
        raise ConfigError(f"shortest step must be > 0 s, got {shortest_step_wall_s!r}")
    share = step_share(mean_lateness_s, shortest_step_wall_s)
    ok = share <= TIMER_TOLERANCE
    needed = dilation * share / TIMER_TOLERANCE
    hint = "ok" if ok else f"timers late by {share:.1%} of a step: try --dilation {math.ceil(needed * 10) / 10:g}"
    return Gap(share, TIMER_TOLERANCE, ok, hint)


def link_gap(achieved_Bps: float, configured_Bps: float, scale: float, dilation: float) -> Gap:
    """Shortfall of the achieved busy-time link rate below the configured one (0 = exact)."""
    if not configured_Bps > 0:
        raise ConfigError(f"configured link rate must be > 0, got {configured_Bps!r}")
    if not achieved_Bps > 0:
        return not_measured("the link carried nothing", LINK_RATE_TOLERANCE)
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
        return not_measured("no bytes went through the kernel", KERNEL_TOLERANCE)
    ratio = kernel_s / modelled_s
    ok = ratio <= KERNEL_TOLERANCE
    hint = "ok" if ok else (
        f"kernel took {ratio:.2f}x its modelled time: try --scale {scale / ratio:.4g} "
        f"or --dilation {math.ceil(dilation * ratio * 10) / 10:g}"
    )
    return Gap(ratio, KERNEL_TOLERANCE, ok, hint)


# A live group's (a collective's step, a ring's prompt, a selection's step, a weight flow's load and TTFT) band
# around the model: its timers may run TIMER_TOLERANCE late and its transfers HANDOFF_REL_TOLERANCE off, the sum
# (the E2E resolution of model/judge/five_tests.py).
GROUP_TOLERANCE = TIMER_TOLERANCE + HANDOFF_REL_TOLERANCE


def model_gap(measured_s: float | None, modelled_s: float, dilation: float, what: str,
              tolerance: float = GROUP_TOLERANCE, *, fixed_scale: str | None = None) -> Gap:
    """|measured / modelled − 1| of a live group's figure (model seconds), within `tolerance`; unmeasured (None or
    NaN, nothing modelled) is never a pass. `fixed_scale`: the run's scale, when it was `auto` and the figure's host
    work grows with its bytes, so the hint says to dilate at that scale (the auto scale would grow them instead)."""
    if measured_s is None or not math.isfinite(measured_s) or not (modelled_s > 0 and math.isfinite(modelled_s)):
        return not_measured(what, tolerance)
    error = measured_s / modelled_s - 1
    ok = abs(error) <= tolerance
    hint = "ok" if ok else (f"{what} {error:+.1%} off the model: try --dilation "
                            f"{math.ceil(dilation * (1 + abs(error) / tolerance) * 10 - 1e-9) / 10:g}")
    if not ok and fixed_scale is not None:
        hint += f" at a fixed --scale {fixed_scale} (the auto scale grows the bytes with the dilation)"
    return Gap(error, tolerance, ok, hint)


# The target for a TP group's step (docs/reference.md §8.3): the all-reduce share of the step within 3 points of the
# model's.
COLLECTIVE_SHARE_TOLERANCE = 0.03


def collective_gap(measured_share: float | None, model_share: float | None, dilation: float,
                   failure: str | None = None) -> Gap:
    """A decode TP group's measured collective share of its step time against the model's, in points of the
    step; a group that failed, or ran no step, is never a pass."""
    if failure:
        return not_measured(f"the TP group failed ({failure[:200]})", COLLECTIVE_SHARE_TOLERANCE)
    if measured_share is None or model_share is None or not math.isfinite(measured_share):
        return not_measured("the TP group ran no step", COLLECTIVE_SHARE_TOLERANCE)
    error = measured_share - model_share
    ok = abs(error) <= COLLECTIVE_SHARE_TOLERANCE
    needed = dilation * (1 + abs(error) / COLLECTIVE_SHARE_TOLERANCE)
    hint = "ok" if ok else (f"the TP group's collectives took {measured_share:.1%} of its steps, the model "
                            f"{model_share:.1%}: try --dilation {math.ceil(needed * 10 - 1e-9) / 10:g} at a fixed "
                            "--scale (the auto scale grows with the dilation, and the all-reduce's bytes with it)")
    return Gap(error, COLLECTIVE_SHARE_TOLERANCE, ok, hint)


def verdict_line(faithful: bool, gaps: dict[str, dict[str, Any]]) -> str:
    """`yes`, or `NO (` the first failed checks' hints `)`: what a run's output prints after "faithful: "."""
    if faithful:
        return "yes"
    return "NO (" + "; ".join(g["hint"] for g in gaps.values() if not g["ok"])[:300] + ")"


def group_fidelity(ok: bool, failures: Sequence[str], gaps: dict[str, Gap]) -> dict[str, Any]:
    """A live group's `faithful`, its `fidelity` block and the line its output prints: faithful only when the run
    ended well (`ok`) and every gap is within its band (a failed run is a gap never measured)."""
    if not ok:
        gaps = {**gaps, "run": not_measured(f"the run failed ({'; '.join(failures)[:200] or 'no result'})", 0.0)}
    faithful, block = assess(gaps)
    return {"faithful": faithful, "fidelity": block, "faithful_line": verdict_line(faithful, block)}


def assess(gaps: dict[str, Gap]) -> tuple[bool, dict[str, dict[str, Any]]]:
    """(`faithful`, the report's `fidelity` dict): faithful only if every measured gap is within its target."""
    return all(g.ok for g in gaps.values()), {name: g.as_dict() for name, g in gaps.items()}


def handoff_within_target(measured_s: float, modelled_s: float) -> bool:
    """The hand-off target (docs/reference.md §8.3): within 2 % or 1 ms of latency + bytes / bandwidth."""
    return abs(measured_s - modelled_s) <= max(HANDOFF_REL_TOLERANCE * modelled_s, HANDOFF_ABS_TOLERANCE_S)


# --- the hand-off against the model ------------------------------------------------------------------------

def on_idle_link(intervals: Sequence[tuple[float, float]], channels: int = 1) -> list[bool]:
    """For each hand-off (start, end), whether it found a lane free: fewer than `channels` others in flight
    when it started. The egress shaper gives every lane the link's full rate (runtime/egress.py), so such a
    hand-off owes the model nothing for queueing."""
    starts = sorted(start for start, _ in intervals)
    ends = sorted(end for _, end in intervals)
    free = []
    for start, end in intervals:
        begun_before = bisect.bisect_left(starts, start)  # others that started strictly earlier
        ended_by = bisect.bisect_right(ends, start) - (1 if end <= start else 0)  # ... and were done by then
        free.append(begun_before - ended_by < channels)
    return free


def prescribed_handoff_s(scenario: Scenario, kv_bytes: float, wire_bytes: float) -> float:
    """What the model prescribes for one hand-off of `kv_bytes` that crossed the link as `wire_bytes` (model
    units): latency + wire / bandwidth; in transit, plus the module's added latency and the wait for its compute
    when that is slower than the wire, `max(wire / bw, ops / (budget × bw))`, ops over the KV (input) bytes
    (docs/reference.md §2, §5). The module's terms are the scenario's (budget, added latency, transform charged or
    not: `Scenario.module`, `Scenario.codec_declaration`), the very ones the middlebox holds a hand-off by."""
    return prescribed_latency_s(scenario) + prescribed_serialise_s(scenario, kv_bytes, wire_bytes)


def _in_transit(scenario: Scenario) -> bool:
    verdict = scenario.module_verdict  # None: no codec, or the codec ran on the GPU
    return verdict is not None and verdict.action is Action.IN_TRANSIT


def prescribed_latency_s(scenario: Scenario) -> float:
    """The latency part of `prescribed_handoff_s`: the link's, plus the module's added latency in transit (a kernel
    on the host runs before the link and adds none)."""
    link = scenario.link_spec
    return link.latency_s + scenario.module.added_latency_s if _in_transit(scenario) else link.latency_s


def prescribed_serialise_s(scenario: Scenario, kv_bytes: float, wire_bytes: float) -> float:
    """The occupancy part of `prescribed_handoff_s`: wire / bandwidth, or the module's compute when slower."""
    link = scenario.link_spec
    wire_s = wire_bytes / link.bandwidth_Bps
    if not _in_transit(scenario):
        return wire_s
    decl, module = scenario.codec_declaration, scenario.module
    compute_s = kv_bytes * decl.charged_ops_per_byte / (module.ops_per_byte * link.bandwidth_Bps)
    return max(wire_s, compute_s)


def prescribed_fetches_s(scenario: Scenario, fetches: Sequence[tuple[float, float, float, float]]) -> list[float]:
    """What the model prescribes for each KV-pool fetch (`fetches`: asked at, KV bytes, wire bytes, the prefill GPU's
    decode of it, in model units), in the given order: the pool link's fetch lane is one FIFO
    (flows/tier/middlebox_pool.py, docs/reference.md §4 style), so a fetch waits for the ones asked before it, then
    occupies the lane for its wire bytes (or the module's inverse when that is slower, `prescribed_serialise_s`) and
    arrives a latency later; with --compress-at gpu the GPU's decode follows. The request leg and the pool's lookup are
    not modelled (no link holds them): a fetch on an idle lane is `prescribed_handoff_s` of its bytes."""
    order = sorted(range(len(fetches)), key=lambda i: fetches[i][0])
    out = [0.0] * len(fetches)
    lane_free = -math.inf
    latency_s = prescribed_latency_s(scenario)
    for i in order:
        asked, kv_bytes, wire_bytes, gpu_s = fetches[i]
        lane_free = max(asked, lane_free) + prescribed_serialise_s(scenario, kv_bytes, wire_bytes)
        out[i] = lane_free - asked + latency_s + gpu_s
    return out


def prescribed_exposed_s(scenario: Scenario, chunks: Sequence[tuple[float, float, float]], layers: int) -> float:
    """What the model prescribes for the exposed part of a streamed hand-off (model/serving/layerwise.py) on a
    free link, model seconds after its first token. `chunks`: (release time, KV bytes, wire bytes) of each chunk in wire
    order, times in model seconds relative to the first token, bytes in model units.

    One prefill step (`--handoff layerwise` without chunking): `layerwise_exposed_s(transfer, overlap)`, the
    transfer prescribed for all its bytes (`prescribed_handoff_s`) less the prefill compute overlap of its L
    layers over the step, whose length the first layer's release gives (it came (L−1)/L of the step before the
    first token). Several steps (chunked prefill): the same FIFO for its actual release times
    (`streamed_ready_s`), which is that formula on one step."""
    if not chunks:
        raise ConfigError("a streamed hand-off needs at least one chunk")
    latency_s = prescribed_latency_s(scenario)
    if scenario.prefill_chunk == 0 and scenario.handoff == HANDOFF_LAYERWISE:
        kv, wire = math.fsum(c[1] for c in chunks), math.fsum(c[2] for c in chunks)
        transfer_s = prescribed_handoff_s(scenario, kv, wire)
        first_release_s = min(c[0] for c in chunks)
        step_s = -first_release_s * layers / (layers - 1) if layers > 1 else 0.0
        overlap_s = prefill_overlap_s(max(0.0, step_s), transfer_s - latency_s, layers)
        return layerwise_exposed_s(transfer_s, overlap_s)
    parts = [(release_s, prescribed_serialise_s(scenario, kv, wire)) for release_s, kv, wire in chunks]
    return max(0.0, streamed_ready_s(parts, latency_s))


def link_rate_target_Bps(scenario: Scenario, link_Bps: float, wire_per_kv_byte: float) -> float:
    """The rate a busy link should reach: `link_Bps`, or less when the module's compute outlasts the wire
    (transit-bound, docs/reference.md §5): a hand-off then occupies the link for ops / (budget × bw) while it carries
    only its wire bytes, so the busy rate is bw × (wire / KV) × budget / charged. `wire_per_kv_byte`: the
    codec's real ratio in the run (wire bytes / KV bytes)."""
    verdict = scenario.module_verdict
    if verdict is None or verdict.action is not Action.IN_TRANSIT:
        return link_Bps
    charged = scenario.codec_declaration.charged_ops_per_byte
    if charged <= 0:
        return link_Bps
    return link_Bps * min(1.0, wire_per_kv_byte * scenario.module.ops_per_byte / charged)


def handoff_gap(measured_s: Sequence[float], modelled_s: Sequence[float], dilation: float) -> Gap:
    """The median hand-off on an idle link against the model's prescription (pairs in the same order);
    `measured` is its signed deviation (measured / prescribed − 1)."""
    if not measured_s:
        return not_measured("no hand-off found the link idle", HANDOFF_REL_TOLERANCE)
    pairs = list(zip(measured_s, modelled_s, strict=True))
    ratio = _quantile([m / p for m, p in pairs], 0.5)
    excess_s = _quantile([m - p for m, p in pairs], 0.5)
    # The hand-off rule (`handoff_within_target`) applied to the median hand-off: 2 %, or 1 ms for short ones.
    ok = abs(ratio - 1) <= HANDOFF_REL_TOLERANCE or abs(excess_s) <= HANDOFF_ABS_TOLERANCE_S
    if ok:
        hint = "ok"
    elif ratio > 1:
        hint = (f"hand-offs on an idle link took {ratio:.3f}x the model: try --dilation "
                f"{math.ceil(dilation * ratio * 10) / 10:g} or a smaller --scale")
    else:
        hint = f"hand-offs on an idle link took {ratio:.3f}x the model: faster than the link allows (is it shaped?)"
    return Gap(ratio - 1, HANDOFF_REL_TOLERANCE, ok, hint)


def handoff_distribution(measured_s: Sequence[float], modelled_s: Sequence[float], total: int) -> dict[str, Any]:
    """measured / prescribed over the hand-offs that found the link idle (`total`: all hand-offs measured)."""
    ratios = [m / p for m, p in zip(measured_s, modelled_s, strict=True)]
    within = sum(handoff_within_target(m, p) for m, p in zip(measured_s, modelled_s, strict=True))
    return {
        "idle_handoffs": len(ratios),
        "handoffs": total,
        "ratio": {q: (_quantile(ratios, p) if ratios else None)
                  for q, p in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
        | {"max": max(ratios) if ratios else None},
        "within_target": within / len(ratios) if ratios else None,
    }
