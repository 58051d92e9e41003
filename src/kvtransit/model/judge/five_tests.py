"""The five tests every candidate is judged by (docs/reference.md §8), from what a run measured, by one rule.

A *candidate* is a flow with a kernel on its link. The five tests:
- **bottleneck**: is the flow link-bound? Its measured share of end-to-end time must reach
  `BOTTLENECK_MIN_SHARE` (a kernel cannot win back more than the flow's share: Amdahl).
- **operations**: does the kernel use only published operations (docs/reference.md §5)? Its declared op types, less
  the published set and wiring (`gather`), must be empty.
- **budget**: is its work per byte within the module's budget? By the arithmetic (charged ops per input byte ×
  ratio = ops per line byte ≤ budget: otherwise the module's compute outlasts the wire, docs/reference.md §5's
  transit-bound) and by what the run measured (the frames the middlebox found transit-bound).
- **precision**: does the flow tolerate the kernel's loss and the analogue path's precision? Given a measured
  task-level loss (model/judge/task_accuracy.py: a real model's perplexity over the kernel's codec'd cache, from
  `kvtransit accuracy --end-to-end --results FILE`), the kernel must raise perplexity by at most
  PPL_INCREASE_TOLERANCE (1 %) on the worst text. Without one (today's default), the kernel's error measured on
  the run's sampled requests must be no worse than an equal-bytes baseline quantiser's on the very same tensors
  (docs/reference.md §6: "Equal-memory baselines ... did better on a frozen model. So accuracy must be measured"), and
  the reason says that no task-level result was given. A lossless kernel must give back exactly what it took
  (error 0).
- **placement**: a pluggable sees one point-to-point stream, a switch sees many and can sum them: the streams
  the kernel combines, declared and measured, must be ones its placement sees.

Fail closed: a test that could not be measured has `passed` None and a reason "not measured: …", and the flow is
then not a candidate. A flow without a kernel on its link is judged "no kernel" (not a failure).

The tests are functions of numbers, one per test, so each flow (today the KV hand-off, `judge_handoff`; later
collectives, selection, weights) maps what it measured onto the same five and the same thresholds.
Pure: numbers in, a verdict out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvtransit.model.catalog.codecs import DEFAULT_FP4_BLOCK, FP8_RATIO, fp4_block_ratio
from kvtransit.model.judge.fidelity import HANDOFF_REL_TOLERANCE, NOT_MEASURED, TIMER_TOLERANCE
from kvtransit.model.judge.task_accuracy import PPL_INCREASE_TOLERANCE, MeasuredTaskLoss
from kvtransit.model.module.budget import (
    PLACEMENT_STREAMS,
    PUBLISHED_OPS,
    WIRING_OPS,
    KernelDeclaration,
    placement_check,
)

TEST_NAMES = ("bottleneck", "operations", "budget", "precision", "placement")
CANDIDATE = "candidate"
NO_KERNEL = "no kernel"
NOT_A_CANDIDATE = "not a candidate"
NO_KERNEL_ON_LINK = "no kernel on this link"

# The flows the report judges (docs/reference.md §8's candidates); only the KV hand-off runs live today.
FLOW_KV_HANDOFF = "kv-handoff"

# --- bottleneck ---------------------------------------------------------------------------------------------
# The emulator's own error band on a request's E2E: each decode step may run TIMER_TOLERANCE (3 %) late and each
# hand-off HANDOFF_REL_TOLERANCE (2 %) off the model (model/judge/fidelity.py, docs/reference.md §8.3). A gain smaller
# than their sum cannot be told from the run's own tolerance.
E2E_RESOLUTION = TIMER_TOLERANCE + HANDOFF_REL_TOLERANCE
# The reference kernels' ratio: fp8 and freq-keep-k at keep 0.5 both halve the bytes (docs/reference.md §5 presets), so
# they remove at most 1 − 1/2 of the flow's wire time.
REFERENCE_KERNEL_RATIO = FP8_RATIO
# The least share of E2E the flow must hold. A kernel that removed all of the flow's time could not move E2E by
# more than its share s (Amdahl); a ratio-2 kernel removes at most half of it, s/2. For that best case to clear
# the emulator's resolution, s/2 ≥ 5 %, i.e. s ≥ 10 %. (The share counts decode's queue wait too, which no
# kernel removes: the threshold is a necessary condition, not a promise of a gain.)
BOTTLENECK_MIN_SHARE = E2E_RESOLUTION / (1 - 1 / REFERENCE_KERNEL_RATIO)

# --- budget -------------------------------------------------------------------------------------------------
# docs/reference.md §5: through the module, time = max(wire_bytes / bw, ops / (budget × bw)); "transit-bound" when the
# second term wins, i.e. charged ops per input byte × ratio (= ops per line byte) > budget. At the limit (1.0)
# the compute exactly keeps pace with the wire.
MAX_COMPUTE_OVER_WIRE = 1.0
# Measured: the share of frames the middlebox's module stage found slower than the wire. Any one of them held
# the link back, so none may be (the arithmetic says the same for a fixed ratio; a frame whose real wire bytes
# beat the declared ratio can differ, and the measurement then decides).
MAX_TRANSIT_BOUND_FRAME_SHARE = 0.0

# --- precision ----------------------------------------------------------------------------------------------
# The equal-bytes baselines and their declared ratios (docs/reference.md §5 presets): fp8 per-block scale (2.0) and
# fp4-block (64/17 ≈ 3.765, "4-bit quantisation", docs/reference.md §6). The kernel is compared with the one whose
# ratio is nearest its own (see `equal_bytes_baseline`).
EQUAL_BYTES_BASELINES: dict[str, float] = {"fp8": FP8_RATIO, "fp4-block": fp4_block_ratio(DEFAULT_FP4_BLOCK)}
# A lossless kernel must give back exactly what it took: any error at all is a loss.
LOSSLESS_MAX_ERROR = 0.0
# What the precision test says when it judges by tensor error because no task-level loss was given.
NO_TASK_LOSS = ("no measured task-level loss given (kvtransit verdict --accuracy-results FILE): judged by tensor "
                "error against the equal-bytes baseline")


def equal_bytes_baseline(ratio: float) -> str:
    """The baseline quantiser whose ratio is nearest `ratio`, by |log(ratio / r)|: bytes scale multiplicatively, so
    ratio 4 is nearer 3.765 (fp4-block) than 2, and 1.5 nearer 2 (fp8). Ratio 2 → fp8; about 3.76 → fp4-block.
    Past 3.765 the kernel moves fewer bytes than its baseline (the comparison then favours the baseline); below
    2 it moves more (it favours the kernel): the report shows both ratios."""
    if not (ratio > 0 and math.isfinite(ratio)):
        raise ValueError(f"ratio must be a finite number > 0, got {ratio!r}")
    return min(EQUAL_BYTES_BASELINES, key=lambda name: abs(math.log(ratio / EQUAL_BYTES_BASELINES[name])))


@dataclass(frozen=True)
class Judgement:
    """One test's outcome: passed (None: not measured, which fails closed), the measured figure and its target as
    short text, a one-line reason with the numbers, and the numbers themselves (`values`)."""

    test: str
    passed: bool | None
    measured: str
    target: str
    reason: str
    values: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FiveTests:
    """A flow's five tests and the verdict they give."""

    flow: str
    kernel: str | None  # None: no kernel on the flow's link
    tests: tuple[Judgement, ...]

    @property
    def failing(self) -> tuple[str, ...]:
        """Tests that did not pass, in docs/reference.md §8's order; a test not measured is one (fail closed)."""
        return tuple(t.test for t in self.tests if t.passed is not True)

    @property
    def verdict(self) -> str:
        if self.kernel is None:
            return NO_KERNEL
        if not self.failing:
            return CANDIDATE
        names = [t.test + (f" ({NOT_MEASURED})" if t.passed is None else "") for t in self.tests
                 if t.passed is not True]
        return f"{NOT_A_CANDIDATE}: {', '.join(names)}"

    @property
    def candidate(self) -> bool:
        return self.kernel is not None and not self.failing

    def as_dict(self) -> dict[str, Any]:
        return {"flow": self.flow, "kernel": self.kernel, "verdict": self.verdict, "candidate": self.candidate,
                "tests": [t.as_dict() for t in self.tests]}


def percent(value: float) -> str:
    """A share as a percentage: one decimal, or two significant digits below 0.1 % (a handshake's share of its
    session is thousandths of a percent, and "0.0%" would hide it)."""
    if 0 < abs(value) < 0.001:
        return f"{value * 100:.2g}%"
    return f"{value:.1%}"


def _not_measured(test: str, what: str, target: str, **values: Any) -> Judgement:
    return Judgement(test, None, "-", target, f"{NOT_MEASURED}: {what}", values)


# --- what a figure rests on ------------------------------------------------------------------------------------
# Every figure a test shows is tagged with its source: measured on a live run, modelled (the model's figure for
# something not run), declared (a kernel declaration's arithmetic, or what a flow is by construction), or a measured
# figure with a modelled factor in it (a share whose part is the model's, or a measured time over a modelled whole).
MEASURED, MODELLED, DECLARED = "measured", "modelled", "declared"
MEASURED_WITH_MODEL = "measured × modelled"
BASES = (MEASURED, MODELLED, DECLARED, MEASURED_WITH_MODEL)


def with_basis(judgement: Judgement, basis: str) -> Judgement:
    """`judgement` with its figure's source (BASES) in its values and, in brackets, at the end of its measured text
    (the text a table cell shows); a test with no figure ("-") is tagged in its values only."""
    if basis not in BASES:
        raise ValueError(f"basis must be one of {', '.join(BASES)}, got {basis!r}")
    values = {**judgement.values, "basis": basis}
    tag = f" ({basis})"
    if judgement.measured == "-" or judgement.measured.endswith(tag):
        return replace(judgement, values=values)
    return replace(judgement, measured=judgement.measured + tag, values=values)


# --- the bottleneck's sensitivity to the time that is not the link's ----------------------------------------------
# A share s of a whole whose other part (compute, queues: the time that is not the flow's link time) is held at a
# model's or a host's speed moves when that speed is wrong: at f × the other part the share is s / (s + f·(1 − s)).
# The table shows it at a third, once and three times the figure it used (a GPU a generation apart either way, or a
# compiled library against a slower or a faster one).
COMPUTE_FACTORS = (0.3, 1.0, 3.0)


def share_at(share: float, factor: float) -> float:
    """The share when the part of the whole that is not the flow takes `factor` × its time."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"factor must be a finite number > 0, got {factor!r}")
    if not 0 <= share <= 1:
        raise ValueError(f"share must be in 0..1, got {share!r}")
    return share / (share + factor * (1 - share)) if share > 0 else 0.0


# --- the five tests, for any flow ---------------------------------------------------------------------------

def bottleneck_test(share: float | None, *, share_of: str, busy: float | None = None, whole: str = "E2E") -> Judgement:
    """The flow's measured share of `whole` (E2E for a request's flows; the step for a collective) ≥
    BOTTLENECK_MIN_SHARE (`share_of` says what it sums); the link's busy fraction is reported beside it, not judged
    (a busy link with a small share still cannot move E2E)."""
    target = f">= {percent(BOTTLENECK_MIN_SHARE)}"
    busy_text = "link busy " + ("not measured" if busy is None else percent(busy))
    values = {"share": share, "min_share": BOTTLENECK_MIN_SHARE, "link_busy": busy}
    if share is None or not math.isfinite(share):
        return _not_measured("bottleneck", f"no share of {whole} was measured ({share_of}); {busy_text}", target,
                             **values)
    passed = share >= BOTTLENECK_MIN_SHARE
    verdict = "link-bound enough to matter" if passed else "too small a share for a kernel to move E2E"
    return Judgement("bottleneck", passed, f"{percent(share)} of {whole}", target,
                      f"{share_of} = {percent(share)} of {whole} {'>=' if passed else '<'} "
                      f"{percent(BOTTLENECK_MIN_SHARE)}: {verdict} ({busy_text})", values)


def operations_test(decl: KernelDeclaration) -> Judgement:
    """The declared op types, less the published set and wiring, must be empty (docs/reference.md §5)."""
    unpublished = sorted(decl.op_types - PUBLISHED_OPS - WIRING_OPS)
    ops = ", ".join(sorted(decl.op_types)) or "none"
    target = f"within {{{', '.join(sorted(PUBLISHED_OPS))}}} (+ wiring: {', '.join(sorted(WIRING_OPS))})"
    values = {"op_types": sorted(decl.op_types), "unpublished": unpublished}
    if unpublished:
        return Judgement("operations", False, ops, target,
                          f"{decl.name} needs {', '.join(unpublished)}, not published by the module", values)
    return Judgement("operations", True, ops, target, f"{decl.name} uses only published ops ({ops})", values)


def budget_test(decl: KernelDeclaration, budget_ops_per_byte: float, *, transit_bound_frames: int | None,
                frames: int | None) -> Judgement:
    """Arithmetic: charged ops per input byte × ratio ≤ budget (not transit-bound, docs/reference.md §5); measured: the
    share of the frames the module stage found transit-bound ≤ MAX_TRANSIT_BOUND_FRAME_SHARE. Both must hold."""
    charged = decl.charged_ops_per_byte
    per_line_byte = charged * decl.ratio
    over = per_line_byte / budget_ops_per_byte
    arithmetic_ok = over <= MAX_COMPUTE_OVER_WIRE
    transform = "charged" if decl.transform_charged else "free"
    arithmetic = (f"{charged:.2f} ops/B (transform {transform}) x ratio {decl.ratio:.3g} = {per_line_byte:.2f} "
                  f"ops per line byte {'<=' if arithmetic_ok else '>'} budget {budget_ops_per_byte:.2f}")
    target = f"<= {budget_ops_per_byte:.2f} ops per line byte, 0 frames transit-bound"
    values = {"charged_ops_per_byte": charged, "ratio": decl.ratio, "ops_per_line_byte": per_line_byte,
              "budget_ops_per_byte": budget_ops_per_byte, "compute_over_wire": over,
              "transit_bound_frames": transit_bound_frames, "frames": frames}
    if transit_bound_frames is None or not frames:
        return _not_measured("budget", f"no frames counted by the middlebox; by arithmetic: {arithmetic}", target,
                             **values)
    share = transit_bound_frames / frames
    values["transit_bound_share"] = share
    measured_ok = share <= MAX_TRANSIT_BOUND_FRAME_SHARE
    measured = f"{transit_bound_frames} of {frames} frames transit-bound"
    passed = arithmetic_ok and measured_ok
    summary = "within budget" if passed else "transit-bound: the module's compute outlasts the wire"
    return Judgement("budget", passed, f"{per_line_byte:.2f} ops/line B; {measured}", target,
                      f"{arithmetic}; measured: {measured}: {summary}", values)


@dataclass(frozen=True)
class PrecisionMeasured:
    """The kernel's error on the run's sampled requests and the equal-bytes baseline's on the same tensors."""

    sampled_requests: int
    k_relative_error: float | None
    v_relative_error: float | None
    baseline_codec: str | None = None
    baseline_k_relative_error: float | None = None
    baseline_v_relative_error: float | None = None
    baseline_ratio: float | None = None  # measured: raw bytes / the baseline's wire bytes


def _finite(*values: float | None) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def task_precision_test(decl: KernelDeclaration, measured: PrecisionMeasured, task: MeasuredTaskLoss) -> Judgement:
    """A lossy kernel judged by its measured task-level loss: perplexity increase ≤ PPL_INCREASE_TOLERANCE. The
    run's tensor errors (if any) are reported beside it, not judged: the task-level figure is the answer to "does
    the flow tolerate the loss", the tensor error only a proxy for it."""
    m = measured
    bits = "analogue path exact" if decl.precision_bits is None else f"analogue path {decl.precision_bits} bits"
    values = asdict(m) | {"lossless": decl.lossless, "precision_bits": decl.precision_bits,
                          "task": asdict(task), "ppl_increase_tolerance": PPL_INCREASE_TOLERANCE}
    target = f"<= +{PPL_INCREASE_TOLERANCE:.0%} perplexity over the exact cache (worst text)"
    passed = task.within_tolerance
    extras = [f"KL {task.kl:.3g} nats/token" if task.kl is not None else "",
              f"top-1 {task.top1:.1%}" if task.top1 is not None else ""]
    measured_text = f"ppl {task.ppl_increase:+.2%} ({', '.join(e for e in extras if e) or 'no KL/top-1'})"
    tensor = (f"; the run's tensor error K {m.k_relative_error:.3g}, V {m.v_relative_error:.3g} over "
              f"{m.sampled_requests} sampled requests" if m.sampled_requests and _finite(m.k_relative_error,
                                                                                         m.v_relative_error) else "")
    if tensor and m.baseline_codec and _finite(m.baseline_k_relative_error, m.baseline_v_relative_error):
        tensor += (f" (context, not judged: the equal-bytes baseline {m.baseline_codec}'s K "
                   f"{m.baseline_k_relative_error:.3g}, V {m.baseline_v_relative_error:.3g} on the same tensors)")
    return Judgement("precision", passed, measured_text, target,
                     f"{decl.name} ({bits}) raises perplexity {task.ppl_increase:+.2%} over the exact cache "
                     f"({task.ppl_exact:.3f} -> {task.ppl:.3f} pooled, {task.tokens} tokens; {task.key}) "
                     f"{'<=' if passed else '>'} +{PPL_INCREASE_TOLERANCE:.0%}: "
                     f"{'within tolerance' if passed else 'NOT within tolerance'}, measured on {task.source}{tensor}",
                     values)


def precision_test(decl: KernelDeclaration, measured: PrecisionMeasured, task: MeasuredTaskLoss | None = None, *,
                   task_note: str = NO_TASK_LOSS) -> Judgement:
    """Lossless: K and V error exactly 0. Lossy, with a measured task-level loss `task`: `task_precision_test`.
    Lossy without one: K and V error each no worse than the equal-bytes baseline's on the same sampled tensors
    (both must hold: attention reads both, and a good K does not make up for a bad V), and the reason ends with
    `task_note` (why no task-level loss was used)."""
    m = measured
    if task is not None and not decl.lossless:
        return task_precision_test(decl, m, task)
    judged = _tensor_precision_test(decl, m)
    if decl.lossless:
        return judged
    return replace(judged, reason=f"{judged.reason}; {task_note}")


def _tensor_precision_test(decl: KernelDeclaration, measured: PrecisionMeasured) -> Judgement:
    m = measured
    bits = "analogue path exact" if decl.precision_bits is None else f"analogue path {decl.precision_bits} bits"
    values = asdict(m) | {"lossless": decl.lossless, "precision_bits": decl.precision_bits}
    if decl.lossless:
        target = f"K and V error = {LOSSLESS_MAX_ERROR:g} (lossless)"
    else:
        baseline = m.baseline_codec or equal_bytes_baseline(decl.ratio)
        base_ratio = EQUAL_BYTES_BASELINES.get(baseline)
        ratio_text = f"ratio {base_ratio:.3g}" if base_ratio else "ratio ?"
        target = f"<= {baseline} ({ratio_text}, nearest to {decl.ratio:.3g}) on the same tensors"
    if not m.sampled_requests or not _finite(m.k_relative_error, m.v_relative_error):
        return _not_measured("precision", "decode sampled no request's KV (accuracy sample 0, or none arrived)",
                             target, **values)
    k, v = m.k_relative_error, m.v_relative_error
    assert k is not None and v is not None  # _finite above
    measured_text = f"K {k:.3g}, V {v:.3g}"
    if decl.lossless:
        passed = k <= LOSSLESS_MAX_ERROR and v <= LOSSLESS_MAX_ERROR
        return Judgement("precision", passed, measured_text, target,
                          f"lossless kernel over {m.sampled_requests} sampled requests: {measured_text} "
                          f"({'exact' if passed else 'NOT exact: it loses data it declares it keeps'}; {bits})",
                          values)
    if not (m.baseline_codec and _finite(m.baseline_k_relative_error, m.baseline_v_relative_error)):
        return _not_measured("precision", f"no equal-bytes baseline measured beside {measured_text} (decode did not "
                             "report one)", target, **values)
    bk, bv = m.baseline_k_relative_error, m.baseline_v_relative_error
    assert bk is not None and bv is not None  # _finite above
    passed = k <= bk and v <= bv
    worse = [f"{part} {mine:.3g} > {theirs:.3g}" for part, mine, theirs in (("K", k, bk), ("V", v, bv))
             if mine > theirs]
    measured_ratio = f" (measured ratio {m.baseline_ratio:.3g})" if m.baseline_ratio else ""
    return Judgement("precision", passed, f"{measured_text} vs {m.baseline_codec} K {bk:.3g}, V {bv:.3g}", target,
                      f"over {m.sampled_requests} sampled requests, {decl.name} (ratio {decl.ratio:.3g}; {bits}) vs "
                      f"{m.baseline_codec}{measured_ratio}: "
                      + ("no worse on K and V" if passed else "worse: " + ", ".join(worse)), values)


def placement_test(decl: KernelDeclaration, streams_measured: float | None, *, measured_as: str) -> Judgement:
    """The streams the kernel combines, declared and measured (`measured_as` says how), must be ones its placement
    sees: a pluggable one, a switch many (model/module/budget.py: PLACEMENT_STREAMS)."""
    check = placement_check(decl)
    seen = PLACEMENT_STREAMS[decl.placement]
    seen_text = "many" if seen is None else str(seen)
    target = f"<= {seen_text} stream{'s' if seen != 1 else ''} (a {decl.placement} sees {seen_text})"
    values = {"placement": decl.placement, "streams_declared": decl.streams, "streams_seen": seen,
              "streams_measured": streams_measured}
    if streams_measured is None or not math.isfinite(streams_measured):
        return _not_measured("placement", f"no streams counted ({measured_as}); declared: {check.describe()}",
                             target, **values)
    combined = round(streams_measured)
    measured_ok = seen is None or combined <= seen
    passed = check.ok and measured_ok
    measured_text = f"{streams_measured:.2f} stream(s)"
    return Judgement("placement", passed, f"declared {decl.streams}, measured {streams_measured:.2f}", target,
                      f"declared: {check.describe()}; measured: {measured_text} ({measured_as})"
                      + ("" if measured_ok else f", more than a {decl.placement} sees"), values)


# --- the KV hand-off ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HandoffMeasured:
    """What a run measured of the KV hand-off (prefill → middlebox → decode), as the report holds it.

    `kv_wait_share`: mean over requests of (hand-off + decode queue wait) / E2E (model/judge/slo.py). `frames_in`,
    `frames_out`: the middlebox's KV frames from the prefill and onto the link; `transit_bound_frames`: those its
    module stage found slower than the wire. None: not measured."""

    kv_wait_share: float | None
    link_busy: float | None
    transit_bound_frames: int | None
    frames_in: int | None
    frames_out: int | None
    precision: PrecisionMeasured

    @property
    def streams_per_handoff(self) -> float | None:
        """KV frames in per frame out: a kernel that sums n streams takes n frames in for each one it sends."""
        if self.frames_in is None or not self.frames_out:
            return None
        return self.frames_in / self.frames_out


# The hand-off in the share is KV ready − first token (model/judge/slo.py), the part a user waits for: with layer-wise
# streaming that is the exposed part only, not the transfer, most of which may hide behind the prefill.
HANDOFF_SHARE_OF = "exposed hand-off + decode queue wait"
HANDOFF_STREAMS_MEASURED_AS = "middlebox KV frames in per frame out"


def judge_handoff(decl: KernelDeclaration | None, budget_ops_per_byte: float, measured: HandoffMeasured, *,
                  no_kernel_reason: str = NO_KERNEL_ON_LINK, task: MeasuredTaskLoss | None = None,
                  task_note: str = NO_TASK_LOSS) -> FiveTests:
    """The KV hand-off's five tests. `decl`: the declaration the run's module was charged for (the codec with the
    run's transform_charged, precision_bits, placement), None when no kernel ran on the link (`no_kernel_reason`
    says why): the flow's share is still measured (it says whether a kernel here could matter), the other tests
    say there is no kernel, and the verdict is "no kernel". `task`, `task_note`: the kernel's measured task-level
    loss, or why there is none (`precision_test`)."""
    bottleneck = bottleneck_test(measured.kv_wait_share, share_of=HANDOFF_SHARE_OF, busy=measured.link_busy)
    if decl is None:
        bottleneck = Judgement(bottleneck.test, bottleneck.passed, bottleneck.measured, bottleneck.target,
                                f"{no_kernel_reason}; {bottleneck.reason}", bottleneck.values)
        rest = tuple(Judgement(name, None, "-", "-", no_kernel_reason) for name in TEST_NAMES[1:])
        return FiveTests(FLOW_KV_HANDOFF, None, (bottleneck, *rest))
    return FiveTests(FLOW_KV_HANDOFF, decl.name, (
        bottleneck,
        operations_test(decl),
        budget_test(decl, budget_ops_per_byte, transit_bound_frames=measured.transit_bound_frames,
                    frames=measured.frames_out),
        precision_test(decl, measured.precision, task, task_note=task_note),
        placement_test(decl, measured.streams_per_handoff, measured_as=HANDOFF_STREAMS_MEASURED_AS),
    ))
