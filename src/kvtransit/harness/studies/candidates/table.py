"""The candidate table (docs/reference.md §8): every flow with a kernel on its link, its five tests, one verdict rule,
and what would flip each verdict.

The rows (harness/studies/candidates/rows.py: docs/reference.md §8's list, in its order; each flow's row is its own) say
what moves, which kernel is declared on it (the declaration comes from the existing declarations, built by the harness
because some live in `kernels/`: `model/catalog/codecs.py`, `flows/selection/model.py`, `kernels/stream_sum.py`,
`kernels/ntt.py`) and what the precision test holds it to. A harness (`harness/studies/candidates/run.py`) measures each
row into a `RowMeasured`; this module judges it.

The five tests are model/judge/five_tests.py's functions with its thresholds; the only additions are for flows that have
no middlebox counting frames (a budget checked on the declaration's arithmetic, said so) and a precision test
against a measured error and its tolerance (`PrecisionFigure`), with the bits an exact flow's arithmetic needs.

**The verdict rule** (one rule, no per-row constant), from the five Judgements:
- `candidate`: all five passed. A test "not measured" never counts as passed (fail closed).
- `promising`: exactly one test did not pass, it was measured (failed, not "not measured"), and one change of a
  stated unknown (module budget, transform charged, precision bits, or the link from the link catalogue;
  docs/reference.md §5's unknowns) makes all five pass when the row is judged again with its own measured figures
  (`verdicts.py: flips`).
- `not a candidate`: anything else; the failing tests are named.
- `exists`: a candidate or promising row whose job an incumbent already does in the field (`RowMeasured.incumbent`:
  NVLink SHARP sums a TP group in the switch).
- `no kernel`: the row's kernel moves no byte off the link and runs no operation (an identity: ratio 1, nothing
  computed), so whatever its five tests say there is nothing on the link to judge (model/judge/five_tests.py's rule
  for a flow without a kernel); the tests are still shown, the bottleneck saying whether a kernel here could matter.
- `not settled`: a live run the row rests on (its own, or a live point of its regime) was not faithful; its tests
  are shown, its verdict not given.
- `not run`: the row's flow could not run here (its extra is not installed); never a guess.
The rule itself is harness/studies/candidates/verdicts.py's `verdict_of`.

Every judged figure carries what it rests on (model/judge/five_tests.py: BASES) in its values and its cell: measured,
modelled, declared (a declaration's arithmetic, or what a flow is by construction), or measured × modelled.

**What would flip each verdict** (`verdicts.py: verdict_flips`): per unknown, the smallest change that
changes the verdict (or,
when none does, the smallest that leaves fewer tests failing), found by judging the row again with the same
measured figures; `flips` is the same search for whether all five pass, which "promising" uses. The changes
tried: module budgets within docs/reference.md §5's range (the named ones and the row's own ops per line byte),
transform charged or free, precision bits from exact down to 1 (only for flows whose precision is a bit count their
arithmetic needs; a lossy flow's error at other bits needs a new run), and every catalogued link ordered by how far its
bandwidth is from the row's (a modelled row's share from the model on that link; a measured one rescaled by the link
model's transfer time, docs/reference.md §2). Pure: numbers in, verdicts out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvtransit.model.catalog.links import Link, link_by_name
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import NOT_MEASURED
from kvtransit.model.judge.five_tests import (
    BOTTLENECK_MIN_SHARE,
    COMPUTE_FACTORS,
    DECLARED,
    MAX_COMPUTE_OVER_WIRE,
    MEASURED,
    MEASURED_WITH_MODEL,
    MODELLED,
    TEST_NAMES,
    FiveTests,
    Judgement,
    PrecisionMeasured,
    bottleneck_test,
    budget_test,
    operations_test,
    percent,
    placement_test,
    precision_test,
    share_at,
    with_basis,
)
from kvtransit.model.judge.task_accuracy import MeasuredTaskLoss
from kvtransit.model.module.budget import MODULE_BUDGETS, PRECISION_BITS_RANGE, KernelDeclaration

CANDIDATE = "candidate"
PROMISING = "promising"
NOT_A_CANDIDATE = "not a candidate"
NOT_RUN = "not run"
NO_KERNEL = "no kernel"
EXISTS = "exists"  # would be a candidate (or promising), but an incumbent already does the job
NOT_SETTLED = "not settled"  # a live run it rests on was not faithful: never judged
VERDICTS = (CANDIDATE, PROMISING, EXISTS, NOT_A_CANDIDATE, NO_KERNEL, NOT_SETTLED, NOT_RUN)
LINE_OUTPUT, LINE_INPUT = "output", "input"


@dataclass(frozen=True)
class Candidate:
    """One row of the table: what moves, the kernel declared on it (and where that declaration comes from), what
    the precision test holds it to, and which of its five figures the harness measures live."""

    name: str
    flow: str
    kernel: str
    tolerance: str


@dataclass(frozen=True)
class Unknowns:
    """The unknowns the table is judged under (docs/reference.md §5): the module's budget (ops per line byte), whether
    the transform is charged (None: each declaration's own), the analogue path's bits (None: exact) and the link (None:
    each row's own)."""

    module_budget: float = MODULE_BUDGETS["sim"]
    transform_charged: bool | None = None
    precision_bits: int | None = None
    link: str | None = None

    def __post_init__(self) -> None:
        if not (self.module_budget > 0 and math.isfinite(self.module_budget)):
            raise ConfigError(f"module budget must be a number of ops per byte > 0, got {self.module_budget!r}")
        lo, hi = PRECISION_BITS_RANGE
        bits = self.precision_bits
        if bits is not None and not (isinstance(bits, int) and not isinstance(bits, bool) and lo <= bits <= hi):
            raise ConfigError(f"precision bits must be an integer in {lo}..{hi}, got {bits!r}")
        if self.link is not None:
            link_by_name(self.link)


@dataclass(frozen=True)
class PrecisionFigure:
    """A measured error and the figure it must not exceed (a measured baseline's error, or a stated tolerance),
    `measured_as` saying what both are. `required_bits`: the bits an exact flow's arithmetic needs from the
    analogue path (a modulus, a BF16 value); None for a lossy flow, whose error was measured at `at_bits` and needs
    a new run at any other."""

    error: float | None
    tolerance: float | None
    measured_as: str
    required_bits: int | None = None
    at_bits: int | None = None


@dataclass(frozen=True)
class RowMeasured:
    """What a row's run measured (or, where `*_modelled`, what the model says because the flow is not live)."""

    name: str
    decl: KernelDeclaration  # as run: its transform_charged and precision_bits are the run's
    share: float | None  # the flow's share of `share_whole`
    share_of: str
    # The same kernel with the transform the other way, where its cost is counted in ops_per_byte rather than by a
    # transform_length (kernels/ntt.py: declaration(transform_charged)); None: the flag alone says it.
    decl_other_transform: KernelDeclaration | None = None
    link: str | None = None  # the link the share was measured on
    link_bytes: float | None = None  # bytes the flow puts on that link per event, at model scale
    # A modelled row's share on every catalogued link (the model evaluated at each), used instead of a rescale.
    share_by_link: dict[str, float] | None = None
    link_messages: int = 1  # one-way messages per event (each pays the link's latency)
    link_busy: float | None = None
    # Which side of the kernel is the link's: "output" for a kernel that encodes before the link (line bytes = its
    # output, ops per line byte = charged × ratio, docs/reference.md §5's transit time), "input" for one that works on
    # what arrives (a sum, a score, an NTT on ciphertexts: line bytes = its input, model/module/budget.py:
    # budget_check).
    line: str = LINE_OUTPUT
    share_modelled: bool = False
    budget_ops_per_byte: float | None = None  # the budget the run's module was charged against
    transit_bound_frames: int | None = None  # counted by a module stage (None: the run had none)
    frames: int | None = None
    precision: PrecisionFigure | None = None
    precision_judgement: Judgement | None = None  # a live run's own (the KV flows' report verdict block)
    streams: float | None = None
    streams_as: str = "streams the kernel combined"
    streams_modelled: bool = False
    # False: `streams` is what the flow is by construction (one client to one server, a rank to its neighbour), not a
    # count the run made; the cell then says "declared", never "measured" (a switch's merged streams are counted).
    streams_counted: bool = True
    not_run: str | None = None  # why the row could not run (e.g. "not installed: pip install .[fhe]")
    share_whole: str = "E2E"  # what the share is of: E2E for a request's flows, "the step" for a collective
    notes: tuple[str, ...] = ()
    # A modelled factor inside a measured share (the model's all-to-all part of a measured collective share, a
    # held compute subtracted from a measured prompt): the share's basis is then "measured × modelled".
    share_factor: str | None = None
    # What the time that is not the flow's link time rests on: a modelled accelerator (the roofline, held on the
    # clock), or a compiled implementation measured on this host. The bottleneck shows the share at
    # COMPUTE_FACTORS × that time.
    compute_basis: str = ""
    share_context: tuple[str, ...] = ()  # other shares shown beside the judged one, each with its basis
    # The kernel's task-level loss on a real model (docs/results/accuracy.json), by the analogue path's bits
    # (`bits_key`): the precision test judges it, the run's tensor errors (`precision_measured`) are context.
    task_losses: Mapping[str, MeasuredTaskLoss] | None = None
    precision_measured: PrecisionMeasured | None = None
    # Where an incumbent already does the kernel's job in the field (NVLink SHARP sums in the switch): the verdict
    # says "exists" where the row would otherwise be a candidate or promising.
    incumbent: str | None = None
    placement_runs: tuple[Judgement, ...] = ()  # the kernel run at another placement (a sum on a pluggable)
    # Why the row is not settled (a live run that was not faithful): its tests are shown, its verdict is not given.
    unsettled: str | None = None


def bits_key(bits: int | None) -> str:
    """The key of `RowMeasured.task_losses` for an analogue path of `bits` (None: exact)."""
    return "exact" if bits is None else str(bits)


def _placement_basis(j: Judgement, counted: bool, modelled: bool) -> Judgement:
    """A placement the run counted is measured; one it did not (one client to one server: what the flow is by
    construction) is judged on the declaration, and the cell says declared."""
    if modelled:
        return with_basis(replace(j, reason=f"modelled, not measured live: {j.reason}"), MODELLED)
    if counted or j.passed is None:
        return with_basis(j, MEASURED)
    streams = j.values.get("streams_declared")
    return with_basis(replace(j, measured=f"{streams} stream{'s' if streams != 1 else ''}, not counted",
                              reason=f"declared, not counted by the run: {j.reason.split('; measured:')[0]}",
                              values={**j.values, "declared_only": True}), DECLARED)


def share_basis(row: RowMeasured) -> str:
    if row.share_modelled:
        return MODELLED
    return MEASURED_WITH_MODEL if row.share_factor else MEASURED


def _bottleneck_basis(j: Judgement, row: RowMeasured, basis: str) -> Judgement:
    """The share tagged with its source (`basis`), and its sensitivity to the time that is not the link's
    (COMPUTE_FACTORS)."""
    reason = j.reason
    if basis == MODELLED:
        reason = f"modelled, not measured live: {reason}"
    elif basis == MEASURED_WITH_MODEL and row.share_factor:
        reason = f"{reason}; a modelled factor: {row.share_factor}"
    values = dict(j.values)
    share = values.get("share")
    if isinstance(share, float | int) and math.isfinite(share) and 0 <= share <= 1:
        at = {f"{f:g}": share_at(float(share), f) for f in COMPUTE_FACTORS}
        values["sensitivity"] = at
        values["holds_across_compute"] = len({v >= BOTTLENECK_MIN_SHARE for v in at.values()}) == 1
        basis_text = f" ({row.compute_basis})" if row.compute_basis else ""
        reason += ("; at " + ", ".join(f"{k}x" for k in at) + f" the time that is not the link's{basis_text}: "
                   + " / ".join(percent(v) for v in at.values())
                   + ("" if values["holds_across_compute"] else " (the verdict of this test turns on it)"))
    if row.share_context:
        reason += "; beside it: " + "; ".join(row.share_context)
    return with_basis(replace(j, reason=reason, values=values), basis)


def rescaled_share(share: float, old: Link, new: Link, nbytes: float, messages: int = 1) -> float:
    """The flow's share of E2E on `new` when it was `share` on `old`: the flow's time scales by the link model's
    time (`messages` latencies + bytes / bandwidth, docs/reference.md §2), the rest of E2E stays."""
    if share <= 0 or old == new:
        return share

    def link_s(link: Link) -> float:
        return messages * link.latency_s + link.serialisation_s(nbytes)

    r = link_s(new) / link_s(old)
    return r * share / (r * share + 1 - share)


def ops_per_line_byte(decl: KernelDeclaration, line: str) -> float:
    """Charged ops per byte of the link the module sits on (`RowMeasured.line`)."""
    if line not in (LINE_OUTPUT, LINE_INPUT):
        raise ConfigError(f"line must be {LINE_OUTPUT!r} or {LINE_INPUT!r}, got {line!r}")
    return decl.charged_ops_per_byte * (decl.ratio if line == LINE_OUTPUT else 1.0)


def declared_budget_test(decl: KernelDeclaration, budget_ops_per_byte: float, why: str,
                         line: str = LINE_OUTPUT) -> Judgement:
    """The budget on the declaration's arithmetic alone (charged ops per line byte ≤ budget, docs/reference.md §5), for
    a flow whose run had no module stage counting frames (`why` says so)."""
    per_line_byte = ops_per_line_byte(decl, line)
    over = per_line_byte / budget_ops_per_byte
    passed = over <= MAX_COMPUTE_OVER_WIRE
    transform = "charged" if decl.transform_charged else "free"
    per = (f"x ratio {decl.ratio:.3g} (the link carries its output)" if line == LINE_OUTPUT
           else "(the link carries its input)")
    return Judgement("budget", passed, f"{per_line_byte:.2f} ops/line B (declared)",
                     f"<= {budget_ops_per_byte:.2f} ops per line byte",
                     f"{decl.charged_ops_per_byte:.2f} ops/B (transform {transform}) {per} = "
                     f"{per_line_byte:.2f} ops per line byte {'<=' if passed else '>'} budget "
                     f"{budget_ops_per_byte:.2f}: {'within budget' if passed else 'transit-bound'}; "
                     f"the declaration checked, no frames counted ({why})",
                     {"ops_per_line_byte": per_line_byte, "budget_ops_per_byte": budget_ops_per_byte,
                      "compute_over_wire": over, "transit_bound_frames": None, "frames": None})


def figure_precision_test(decl: KernelDeclaration, figure: PrecisionFigure | None) -> Judgement:
    """An exact flow: the analogue path must deliver its `required_bits` (when bits are declared), and its measured
    error must be within tolerance. A lossy flow: its error, measured at the declared bits, within tolerance."""
    if figure is None:
        return Judgement("precision", None, "-", "-", f"{NOT_MEASURED}: no error measured")
    target = "-" if figure.tolerance is None else f"<= {figure.tolerance:.3g} ({figure.measured_as})"
    values = {"error": figure.error, "tolerance": figure.tolerance, "required_bits": figure.required_bits,
              "precision_bits": decl.precision_bits, "at_bits": figure.at_bits}
    bits = decl.precision_bits
    if figure.required_bits is not None and bits is not None and bits < figure.required_bits:
        return Judgement("precision", False, f"{bits}-bit analogue path", f">= {figure.required_bits} bits (exact)",
                         f"the flow's arithmetic needs {figure.required_bits} exact bits; an analogue path of {bits} "
                         f"bits cannot give them", values)
    if figure.required_bits is None and bits != figure.at_bits:
        at = "exact" if figure.at_bits is None else f"{figure.at_bits} bits"
        want = "exact" if bits is None else f"{bits} bits"
        return Judgement("precision", None, "-", target, f"{NOT_MEASURED}: the error was measured with the analogue "
                         f"path {at}; at {want} it needs a run", values)
    if figure.error is None or figure.tolerance is None or not math.isfinite(figure.error):
        return Judgement("precision", None, "-", target, f"{NOT_MEASURED}: {figure.measured_as}", values)
    passed = figure.error <= figure.tolerance
    return Judgement("precision", passed, f"{figure.error:.3g}", target,
                     f"{figure.measured_as}: {figure.error:.3g} {'<=' if passed else '>'} {figure.tolerance:.3g}",
                     values)


def _precision(row: RowMeasured, decl: KernelDeclaration) -> Judgement:
    """The kernel's measured task-level loss at the analogue path's bits where the row has one (the run's tensor
    errors as context); else the live run's own judgement (at its own bits only); else the row's error figure."""
    if row.task_losses is not None and not decl.lossless:
        task = row.task_losses.get(bits_key(decl.precision_bits))
        measured = row.precision_measured or PrecisionMeasured(0, None, None)
        if task is not None:
            return precision_test(decl, measured, task)
        want = "exact" if decl.precision_bits is None else f"{decl.precision_bits} bits"
        return Judgement("precision", None, "-", "task-level loss within tolerance",
                         f"{NOT_MEASURED}: no task-level loss measured for {decl.name} at {want}")
    if row.precision_judgement is not None:
        judged = row.precision_judgement
        if decl.precision_bits != row.decl.precision_bits:
            want = "exact" if decl.precision_bits is None else f"{decl.precision_bits} bits"
            judged = Judgement("precision", None, "-", judged.target,
                               f"{NOT_MEASURED}: the run measured its own analogue path; at {want} it needs a run")
        return judged
    return figure_precision_test(decl, row.precision)


def decl_under(row: RowMeasured, u: Unknowns) -> KernelDeclaration:
    decl = row.decl
    charged = decl.transform_charged if u.transform_charged is None else u.transform_charged
    other = row.decl_other_transform
    if other is not None and other.transform_charged == charged:
        decl = other
    return replace(decl, transform_charged=charged, precision_bits=u.precision_bits)


def judge_row(row: RowMeasured, u: Unknowns) -> FiveTests:
    """The row's five tests under the unknowns `u`, from its measured figures (model/judge/five_tests.py's tests)."""
    decl = decl_under(row, u)
    share = row.share
    share_of = row.share_of
    basis = share_basis(row)
    if u.link is not None and row.link is not None and u.link != row.link:
        if row.share_by_link is not None and u.link in row.share_by_link:
            share = row.share_by_link[u.link]
            share_of = f"{share_of}, on {u.link} by the same model"
            basis = MODELLED
        elif share is not None and row.link_bytes is not None:
            share = rescaled_share(share, link_by_name(row.link), link_by_name(u.link), row.link_bytes,
                                   row.link_messages)
            share_of = f"{share_of}, rescaled from {row.link} to {u.link} by the link model"
            basis = MODELLED if basis == MODELLED else MEASURED_WITH_MODEL
        else:
            share = None
            share_of = f"{share_of} (measured on {row.link}; no bytes to rescale it to {u.link})"
    bottleneck = _bottleneck_basis(bottleneck_test(share, share_of=share_of, busy=row.link_busy,
                                                   whole=row.share_whole), row, basis)
    same_module = (row.budget_ops_per_byte == u.module_budget and decl.transform_charged == row.decl.transform_charged)
    if row.frames is not None and same_module:
        budget = budget_test(decl, u.module_budget, transit_bound_frames=row.transit_bound_frames, frames=row.frames)
        if budget.passed is not None:  # the arithmetic is the declaration's, the frames were counted
            per_line_byte = budget.values["ops_per_line_byte"]
            budget = replace(budget, measured=f"{per_line_byte:.2f} ops/line B ({DECLARED}); "
                                              f"{row.transit_bound_frames} of {row.frames} frames transit-bound")
        budget = with_basis(budget, MEASURED)
    else:
        why = ("the run's module was charged another budget" if row.frames is not None
               else "this flow's run has no module stage")
        budget = with_basis(declared_budget_test(decl, u.module_budget, why, row.line), DECLARED)
    precision = with_basis(_precision(row, decl), MEASURED)
    placement = _placement_basis(placement_test(decl, row.streams, measured_as=row.streams_as),
                                 row.streams_counted, row.streams_modelled)
    operations = with_basis(operations_test(decl), DECLARED)
    return FiveTests(row.name, decl.name, (bottleneck, operations, budget, precision, placement))


__all__ = ["TEST_NAMES", "Candidate", "PrecisionFigure", "RowMeasured", "Unknowns",
           "decl_under", "declared_budget_test", "figure_precision_test", "judge_row",
           "rescaled_share"]
