"""The candidate table's verdicts: the one rule (`verdict_of`), what would flip each verdict (`flips`,
`verdict_flips`), and a whole table judged (`judge_table`). The rule and the search are described in
`candidates.py`, which holds the rows, their measured figures and the five tests of one row (`judge_row`).

Pure: numbers in, verdicts out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from kvtransit.harness.studies.candidates.table import (
    CANDIDATE,
    EXISTS,
    NO_KERNEL,
    NOT_A_CANDIDATE,
    NOT_RUN,
    NOT_SETTLED,
    PROMISING,
    RowMeasured,
    Unknowns,
    bits_key,
    decl_under,
    judge_row,
    ops_per_line_byte,
)
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.judge.fidelity import NOT_MEASURED
from kvtransit.model.judge.five_tests import BASES, FiveTests
from kvtransit.model.module.budget import MODULE_BUDGETS, PRECISION_BITS_RANGE, KernelDeclaration


@dataclass(frozen=True)
class Flip:
    """The smallest change of one unknown that changes whether the row passes all five."""

    unknown: str  # "module budget" | "transform" | "precision bits" | "link"
    change: str
    passes_after: bool
    failing_after: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"unknown": self.unknown, "change": self.change, "passes_after": self.passes_after,
                "failing_after": list(self.failing_after)}


def _bits_text(bits: int | None) -> str:
    return "exact" if bits is None else f"{bits} bits"


def _budget_options(row: RowMeasured, u: Unknowns) -> list[tuple[str, Unknowns]]:
    decl = decl_under(row, u)
    threshold = ops_per_line_byte(decl, row.line)  # the least budget it fits (docs/reference.md §5)
    named = {f"{v:g} ({k})": v for k, v in MODULE_BUDGETS.items()}
    # Only budgets docs/reference.md §5 publishes a range for (low..high): a kernel that needs more is not a module's.
    if min(MODULE_BUDGETS.values()) <= threshold <= max(MODULE_BUDGETS.values()):
        named.setdefault(f"{threshold:.3g} (its own ops per line byte)", threshold)
    options = [(label, b) for label, b in named.items() if b != u.module_budget]
    options.sort(key=lambda lb: abs(math.log(lb[1] / u.module_budget)))
    return [(f"module budget {u.module_budget:g} -> {label} ops/line B", replace(u, module_budget=b))
            for label, b in options]


def _bits_options(row: RowMeasured, u: Unknowns) -> list[tuple[str, Unknowns]]:
    lo, hi = PRECISION_BITS_RANGE
    values: list[int | None] = [None, *range(hi, lo - 1, -1)]
    if row.task_losses:  # a lossy flow whose task-level loss was measured at these bits (and only these)
        values = [v for v in values if bits_key(v) in row.task_losses or v == u.precision_bits]
    elif row.precision is None or row.precision.required_bits is None:
        return []  # a lossy flow's error at other bits is a new measurement, not a re-judgement
    here = values.index(u.precision_bits)
    ordered = sorted((v for v in values if v != u.precision_bits), key=lambda v: abs(values.index(v) - here))
    return [(f"precision {_bits_text(u.precision_bits)} -> {_bits_text(v)}", replace(u, precision_bits=v))
            for v in ordered]


def _link_options(row: RowMeasured, u: Unknowns) -> list[tuple[str, Unknowns]]:
    here = u.link or row.link
    if here is None or row.share is None or row.link_bytes is None:
        return []
    bw = LINKS[here].bandwidth_Bps
    others = sorted((n for n in LINKS if n != here), key=lambda n: abs(math.log(LINKS[n].bandwidth_Bps / bw)))
    return [(f"link {here} -> {n}", replace(u, link=n)) for n in others]


def _searches(row: RowMeasured, u: Unknowns) -> dict[str, list[tuple[str, Unknowns]]]:
    charged = decl_under(row, u).transform_charged
    has_transform = row.decl.has_transform or row.decl_other_transform is not None
    return {
        "module budget": _budget_options(row, u),
        "transform": ([(f"transform {'charged -> free' if charged else 'free -> charged'}",
                        replace(u, transform_charged=not charged))] if has_transform else []),
        "precision bits": _bits_options(row, u),
        "link": _link_options(row, u),
    }


def flips(row: RowMeasured, u: Unknowns) -> list[Flip]:
    """Per unknown, the nearest change that changes whether the row passes all five (none: no change of it does).
    This is what the rule's "promising" asks of a row."""
    if row.not_run is not None:
        return []
    passes = not judge_row(row, u).failing
    found = []
    for unknown, options in _searches(row, u).items():
        for change, changed in options:
            failing = judge_row(row, changed).failing
            if (not failing) != passes:
                found.append(Flip(unknown, change, not failing, failing))
                break
    return found


def verdict_under(row: RowMeasured, u: Unknowns) -> str:
    """The rule's verdict for `row` judged under `u`."""
    return verdict_of(judge_row(row, u), flips(row, u), decl_under(row, u), incumbent=row.incumbent)[0]


@dataclass(frozen=True)
class VerdictFlip:
    """The nearest change of one unknown that changes the row's verdict (`verdict_after`), or, when none does, the
    nearest that makes a failing test pass (`closer`: the verdict stays, with fewer tests failing)."""

    unknown: str
    change: str
    verdict_after: str
    failing_after: tuple[str, ...]
    closer: bool = False

    def describe(self) -> str:
        failing = ", ".join(self.failing_after)
        if self.closer:
            return f"{self.change}: still {self.verdict_after}, failing only {failing}"
        return f"{self.change}: {self.verdict_after}" + (f" (fails {failing})" if failing else "")

    def as_dict(self) -> dict[str, Any]:
        return {"unknown": self.unknown, "change": self.change, "verdict_after": self.verdict_after,
                "failing_after": list(self.failing_after), "closer": self.closer, "text": self.describe()}


def verdict_flips(row: RowMeasured, u: Unknowns) -> list[VerdictFlip]:
    """What would flip the row's verdict, per unknown (module docstring): the nearest change of it that changes the
    verdict, else the nearest that leaves fewer tests failing; none when no change of it does either."""
    if row.not_run is not None:
        return []
    here = judge_row(row, u).failing
    verdict = verdict_under(row, u)
    found = []
    for unknown, options in _searches(row, u).items():
        closer: VerdictFlip | None = None
        for change, changed in options:
            failing = judge_row(row, changed).failing
            after = verdict_under(row, changed)
            if after != verdict:
                found.append(VerdictFlip(unknown, change, after, failing))
                break
            if closer is None and set(failing) < set(here):
                closer = VerdictFlip(unknown, change, after, failing, closer=True)
        else:
            if closer is not None:
                found.append(closer)
    return found


@dataclass(frozen=True)
class RowVerdict:
    row: RowMeasured
    tests: FiveTests | None  # None: not run
    verdict: str
    why: str
    flips: tuple[VerdictFlip, ...]

    @property
    def rests_on(self) -> str:
        """Which of its tests rest on what: "bottleneck measured; operations declared; ..." (five_tests.BASES)."""
        if self.tests is None:
            return "nothing: not run"
        by: dict[str, list[str]] = {}
        for t in self.tests.tests:
            by.setdefault(t.values.get("basis", "not measured") if t.passed is not None else "not measured",
                          []).append(t.test)
        order = [*BASES, "not measured"]
        return "; ".join(f"{basis}: {', '.join(by[basis])}" for basis in order if basis in by)

    def as_dict(self) -> dict[str, Any]:
        r = self.row
        return {"candidate": r.name, "kernel": r.decl.name, "verdict": self.verdict, "why": self.why,
                "rests_on": self.rests_on, "incumbent": r.incumbent, "unsettled": r.unsettled,
                "compute_basis": r.compute_basis,
                "tests": [] if self.tests is None else [t.as_dict() for t in self.tests.tests],
                "placement_runs": [t.as_dict() for t in r.placement_runs],
                "flips": [f.as_dict() for f in self.flips], "notes": list(r.notes), "not_run": r.not_run}


def verdict_of(tests: FiveTests, row_flips: list[Flip] | tuple[Flip, ...],
               decl: KernelDeclaration | None = None, *, incumbent: str | None = None,
               unsettled: str | None = None) -> tuple[str, str]:
    """The one rule (module docstring): (verdict, why). `decl`, the kernel judged: an identity is "no kernel";
    `unsettled`, why a live run the row rests on was not faithful: "not settled", never judged; `incumbent`, what
    already does the kernel's job: a row that would be a candidate or promising "exists"."""
    if unsettled is not None:
        return NOT_SETTLED, f"not settled: {unsettled}; its tests are shown, not judged (run it again)"
    if decl is not None and decl.identity:
        return NO_KERNEL, (f"its kernel ({decl.name}) moves no byte off the link and computes nothing (ratio 1, no "
                           "operation): nothing on the link to judge")
    failing = tests.failing
    by_name = {t.test: t for t in tests.tests}
    named = ", ".join(f + (f" ({NOT_MEASURED})" if by_name[f].passed is None else "") for f in failing)
    fixes = [f for f in row_flips if f.passes_after]
    if not failing:
        verdict, why = CANDIDATE, "all five tests pass"
    elif len(failing) == 1 and by_name[failing[0]].passed is False and fixes:
        verdict, why = PROMISING, f"fails {named} only; passes all five with {fixes[0].change}"
    else:
        return NOT_A_CANDIDATE, f"fails {named}"
    if incumbent is not None:
        return EXISTS, f"{why}, and the job is done today: {incumbent}"
    return verdict, why


def judge_one(row: RowMeasured, u: Unknowns) -> RowVerdict:
    """One row judged under `u`: its five tests, the rule's verdict and what would flip it."""
    if row.not_run is not None:
        return RowVerdict(row, None, NOT_RUN, row.not_run, ())
    tests = judge_row(row, u)
    verdict, why = verdict_of(tests, flips(row, u), decl_under(row, u), incumbent=row.incumbent,
                              unsettled=row.unsettled)
    return RowVerdict(row, tests, verdict, why, tuple(verdict_flips(row, u)) if row.unsettled is None else ())


def judge_table(rows: list[RowMeasured], u: Unknowns) -> list[RowVerdict]:
    return [judge_one(row, u) for row in rows]


def against_deck(verdict: RowVerdict, deck_verdict: str | None) -> str | None:
    """Where the measured verdict differs from the deck's (docs/reference.md §8.5), the figure that decides it; None
    where they agree (or the deck gave none)."""
    if deck_verdict is None or verdict.verdict == deck_verdict:
        return None
    row, tests = verdict.row, verdict.tests
    if verdict.verdict == NOT_SETTLED:
        return f"not settled here: {row.unsettled}"
    if verdict.verdict == NOT_RUN or tests is None:
        return f"not run here: {row.not_run}"
    if verdict.verdict == NO_KERNEL:
        return f"its kernel ({row.decl.name}) is the identity: ratio {row.decl.ratio:g}, no operation"
    if verdict.verdict == EXISTS:
        return f"an incumbent does the job: {row.incumbent}"
    failing = [t for t in tests.tests if t.passed is not True]
    if failing:
        return "; ".join(f"{t.test}: {t.measured} against {t.target}" for t in failing)
    by = {t.test: t for t in tests.tests}
    return f"all five pass: bottleneck {by['bottleneck'].measured}, budget {by['budget'].measured}"
