"""Regimes, not points: where on a grid of operating conditions a row's kernel passes all five tests.

Each row with a `Regime` names two axes (load × link for the hand-off and the tier, context × budget for selection,
TP size × batch for the sum, ring size × link for ring attention, adapters × capacity for weights; the ciphertexts
link × what their share is of) and a model of the tests that move over them (the bottleneck's share, and for
selection the precision of what a page budget keeps). The model is evaluated at every grid point
(`map_regime`); the tests the axes do not move are the row's own, judged from its live run. A point passes when
all five do.

Then the map is confirmed live (`confirm`): the row runs again (its own function, `RowContext.point`) at one point
on each side of the frontier nearest its own point (the row's own run counts as the point on its side), and where
the live verdict on a mapped test differs from the model's, at one more point past it. Where no test changes over
the grid there is no frontier, and the live point is the grid's most link-bound one. Each live point is a whole run,
judged by the same five tests; one that was not faithful leaves the row "not settled" (`RegimeResult.unsettled`).
Every live run goes through `run_until_faithful`, the one place a retrying runner plugs in.

`where_text` says in a sentence where the kernel passes ("passes all five on eth-25g at >= ~10 req/s; nowhere on
ib-ndr, nvlink4"), and where it is link-bound when that region is larger.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvtransit.harness.studies.candidates.rows import RowContext, RowRun
from kvtransit.harness.studies.candidates.table import Unknowns
from kvtransit.harness.studies.candidates.verdicts import RowVerdict, judge_one
from kvtransit.model.errors import ConfigError


@dataclass(frozen=True)
class Axis:
    """One axis of a regime: the `RowContext.point` key the row's run reads, its title, its values in order, and
    how a value is written (`unit`: after a number; a name stands alone)."""

    key: str
    title: str
    values: tuple[Any, ...]
    unit: str = ""
    choices: tuple[Any, ...] | None = None  # the catalogue an axis value must come from (None: any positive number)
    prefix: str = ""  # before a number ("TP" for "TP4")
    fraction: bool = False  # a value below 1 written as 1/n (a page budget)

    def label(self, value: Any) -> str:
        if isinstance(value, str):
            return value
        if self.fraction and isinstance(value, float) and value < 1:
            text = f"1/{round(1 / value):d}"
        else:
            whole = isinstance(value, float) and value >= 1 and value.is_integer()
            text = f"{int(value):,}" if whole else f"{value:.3g}" if isinstance(value, float) else f"{value:,}"
        return f"{self.prefix}{text}{' ' + self.unit if self.unit else ''}"

    def check(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        """`values` if each is on this axis's catalogue (or a positive number), else a one-line ConfigError."""
        if not values:
            raise ConfigError(f"regime axis {self.key!r}: no values")
        for v in values:
            if self.choices is not None and v not in self.choices:
                raise ConfigError(f"regime axis {self.key!r}: {v!r} is not in the catalogue (choose from: "
                                  f"{', '.join(map(str, self.choices))})")
            if self.choices is None and not (isinstance(v, int | float) and not isinstance(v, bool)
                                             and v > 0 and math.isfinite(v)):
                raise ConfigError(f"regime axis {self.key!r}: {v!r} is not a number > 0")
        return values


@dataclass(frozen=True)
class PointModel:
    """The model at one grid point: the flow's share (None: the model has none there), the mapped tests' verdicts
    (`passed`, by test name) and a note when a test could not be modelled."""

    share: float | None
    passed: dict[str, bool | None]
    note: str = ""


@dataclass(frozen=True)
class Regime:
    """A row's operating conditions (two axes), the model over them (`evaluate(ctx, x, y)`), which tests it decides
    (`varies`), what the model is (`model`), and `gap`: why there is no model yet (the grid is then not mapped; the
    live points still run)."""

    x: Axis
    y: Axis
    # (the row's context, its own run, x, y) -> the model there; the own run gives what the model takes from it (a
    # measured compute time, where the row's compute basis is a measurement)
    evaluate: Callable[[RowContext, RowRun, Any, Any], PointModel]
    model: str
    home: Callable[[RowContext], tuple[Any, Any]]  # the row's own point on the axes
    varies: tuple[str, ...] = ("bottleneck",)
    gap: Callable[[RowContext], str | None] | None = None  # why there is no model (None: there is)
    runnable: Callable[[Any, Any], bool] | None = None  # which points a live run can take (None: every one)

    def with_values(self, axis_key: str, values: tuple[Any, ...]) -> Regime:
        if self.x.key == axis_key:
            return replace(self, x=replace(self.x, values=self.x.check(values)))
        if self.y.key == axis_key:
            return replace(self, y=replace(self.y, values=self.y.check(values)))
        raise ConfigError(f"regime axis {axis_key!r} is not this row's (its axes: {self.x.key}, {self.y.key})")


@dataclass
class GridPoint:
    x: Any
    y: Any
    model: PointModel
    passes: bool | None  # all five: the mapped tests by the model, the others by the row's live run


@dataclass
class LivePoint:
    x: Any
    y: Any
    run: RowRun
    verdict: RowVerdict
    model: PointModel | None
    own: bool = False  # the row's own run, not a new one
    label: str = ""

    @property
    def faithful(self) -> bool:
        return self.run.is_faithful

    def live_passed(self, test: str) -> bool | None:
        if self.verdict.tests is None:
            return None
        return next(t.passed for t in self.verdict.tests.tests if t.test == test)

    def agrees(self, varies: tuple[str, ...]) -> bool | None:
        """Whether the live run's verdict on every mapped test is the model's (None: not comparable, or the live run
        was not faithful: it confirms nothing)."""
        if self.model is None or not self.faithful:
            return None
        pairs = [(self.live_passed(t), self.model.passed.get(t)) for t in varies]
        if any(live is None or model is None for live, model in pairs):
            return None
        return all(live == model for live, model in pairs)

    @property
    def share(self) -> float | None:
        if self.verdict.tests is None:
            return None
        share = self.verdict.tests.tests[0].values.get("share")
        return float(share) if isinstance(share, int | float) else None


@dataclass
class RegimeResult:
    regime: Regime
    grid: list[list[GridPoint]]  # [y][x]
    gap: str | None
    decides: str  # what the frontier is of: "all five", or a mapped test when all five pass nowhere/everywhere
    fixed_failing: tuple[str, ...] = ()  # tests the axes do not move that fail (or were not measured) at the row's run
    frontier: list[tuple[tuple[Any, Any], tuple[Any, Any]]] = field(default_factory=list)
    live: list[LivePoint] = field(default_factory=list)
    where: str = ""

    @property
    def unsettled(self) -> str | None:
        bad = [p for p in self.live if not p.own and not p.faithful]
        if not bad:
            return None
        return "; ".join(f"the live point {p.label} was not faithful ({p.run.faithful})" for p in bad)[:400]

    @property
    def disagreements(self) -> list[LivePoint]:
        return [p for p in self.live if p.agrees(self.regime.varies) is False]

    def point(self, x: Any, y: Any) -> GridPoint | None:
        for row in self.grid:
            for p in row:
                if p.x == x and p.y == y:
                    return p
        return None


def run_until_faithful(run_once: Callable[[], RowRun], *, log: Callable[[str], None] = print) -> RowRun:
    """Every live run the table makes (a row's own, a regime's confirmation) goes through here: the one place the
    retrying runner plugs in (calibrate the host, retry at a larger dilation until faithful: harness/up's autopilot).
    Until it does, one run at the dilation the row holds; a run that was not faithful is returned as it is, and
    the row is "not settled"."""
    run = run_once()
    if not run.is_faithful:
        log(f"candidates: not faithful, not retried (no retrying runner yet): {run.faithful[:160]}")
    return run


def _fixed(verdict: RowVerdict, varies: tuple[str, ...]) -> dict[str, bool | None]:
    assert verdict.tests is not None
    return {t.test: t.passed for t in verdict.tests.tests if t.test not in varies}


def map_regime(regime: Regime, ctx: RowContext, own: RowRun, verdict: RowVerdict) -> RegimeResult:
    """The model at every grid point, each point's all-five verdict (the mapped tests by the model, the rest by the
    row's live run), and the frontier the live points will straddle."""
    gap = regime.gap(ctx) if regime.gap is not None else None
    fixed = _fixed(verdict, regime.varies)
    grid: list[list[GridPoint]] = []
    for y in regime.y.values:
        row = []
        for x in regime.x.values:
            model = (PointModel(None, dict.fromkeys(regime.varies), gap) if gap is not None
                     else regime.evaluate(ctx, own, x, y))
            tests = [*(model.passed.get(t) for t in regime.varies), *fixed.values()]
            passes = None if any(t is None for t in tests) else all(tests)
            row.append(GridPoint(x, y, model, passes))
        grid.append(row)
    result = RegimeResult(regime, grid, gap, "all five",
                          tuple(t for t, passed in fixed.items() if passed is not True))
    result.frontier, result.decides = _frontier(result)
    return result


def _decider(result: RegimeResult) -> tuple[str, Callable[[GridPoint], bool | None]]:
    points = [p for row in result.grid for p in row]
    if len({p.passes for p in points if p.passes is not None}) > 1:
        return "all five", lambda p: p.passes
    for test in result.regime.varies:
        if len({p.model.passed.get(test) for p in points if p.model.passed.get(test) is not None}) > 1:
            return test, lambda p, t=test: p.model.passed.get(t)
    return "nothing (no test changes over the grid)", lambda p: None


def _frontier(result: RegimeResult) -> tuple[list[tuple[tuple[Any, Any], tuple[Any, Any]]], str]:
    decides, value = _decider(result)
    pairs = []
    grid = result.grid
    for j, row in enumerate(grid):
        for i, p in enumerate(row):
            for q in ([row[i + 1]] if i + 1 < len(row) else []) + ([grid[j + 1][i]] if j + 1 < len(grid) else []):
                a, b = value(p), value(q)
                if a is not None and b is not None and a != b:
                    pairs.append(((p.x, p.y), (q.x, q.y)))
    return pairs, decides


def _index(result: RegimeResult, xy: tuple[Any, Any]) -> tuple[int, int]:
    return result.regime.x.values.index(xy[0]), result.regime.y.values.index(xy[1])


def confirmation_points(result: RegimeResult, home: tuple[Any, Any]) -> list[tuple[Any, Any]]:
    """The points to run live: one on each side of the frontier pair nearest the row's own point (its own counts),
    else (no frontier) the grid's point of the largest modelled share."""
    regime = result.regime
    runnable = regime.runnable or (lambda x, y: True)
    pairs = [pair for pair in result.frontier if all(runnable(*xy) for xy in pair)]
    if pairs:
        try:
            hx, hy = _index(result, home)
        except ValueError:
            hx, hy = 0, 0

        def distance(pair: tuple[tuple[Any, Any], tuple[Any, Any]]) -> float:
            return min(abs(_index(result, xy)[0] - hx) + abs(_index(result, xy)[1] - hy) for xy in pair)

        nearest = min(pairs, key=distance)
        return [nearest[0], nearest[1]]
    shares = [(p.model.share, (p.x, p.y)) for row in result.grid for p in row
              if p.model.share is not None and runnable(p.x, p.y)]
    if not shares:
        return [home] if home[0] in regime.x.values and home[1] in regime.y.values else []
    return [max(shares, key=lambda s: s[0])[1]]


def _beyond(result: RegimeResult, xy: tuple[Any, Any], partner: tuple[Any, Any]) -> tuple[Any, Any] | None:
    """The next grid point past `xy`, away from `partner` along the line they share (None at the edge)."""
    (i, j), (pi, pj) = _index(result, xy), _index(result, partner)
    ni, nj = i + (i - pi), j + (j - pj)
    xs, ys = result.regime.x.values, result.regime.y.values
    if 0 <= ni < len(xs) and 0 <= nj < len(ys) and (ni, nj) != (i, j):
        return xs[ni], ys[nj]
    return None


def point_label(regime: Regime, x: Any, y: Any) -> str:
    def slug(axis: Axis, v: Any) -> str:
        text = axis.label(v).replace(" ", "").replace("/", "-").replace(",", "")
        return f"{axis.key}-{text}"
    return f"{slug(regime.x, x)}_{slug(regime.y, y)}"


def confirm(result: RegimeResult, ctx: RowContext, own: RowRun, own_verdict: RowVerdict,
            run_row: Callable[[RowContext], RowRun], u: Unknowns, log: Callable[[str], None] = print) -> None:
    """Run the row live at the confirmation points (its own run standing for its own point), one more past any
    point where live and model disagree, and write the where-sentence."""
    regime = result.regime
    home = regime.home(ctx)

    def live(xy: tuple[Any, Any]) -> LivePoint:
        gp = result.point(*xy)
        model = gp.model if gp is not None and result.gap is None else None
        if xy == home:
            return LivePoint(xy[0], xy[1], own, own_verdict, model, own=True, label="the row's own run")
        label = point_label(regime, *xy)
        point_ctx = replace(ctx, point={regime.x.key: xy[0], regime.y.key: xy[1]}, label=label)
        log(f"candidates: {ctx.name}: live point {regime.x.label(xy[0])}, {regime.y.label(xy[1])} ...")
        run = run_until_faithful(lambda: run_row(point_ctx), log=log)
        return LivePoint(xy[0], xy[1], run, judge_one(run.measured, u), model, label=label)

    points = confirmation_points(result, home)
    if home not in points and home[0] in regime.x.values and home[1] in regime.y.values:
        result.live.append(live(home))  # the row's own run is a live point too, wherever it sits
    for xy in points:
        result.live.append(live(xy))
    if len(points) == 2:
        for xy, partner in ((points[0], points[1]), (points[1], points[0])):
            lp = next(p for p in result.live if (p.x, p.y) == xy)
            if lp.agrees(regime.varies) is False and (nxt := _beyond(result, xy, partner)) is not None \
                    and (regime.runnable is None or regime.runnable(*nxt)) \
                    and all((p.x, p.y) != nxt for p in result.live):
                result.live.append(live(nxt))
    result.where = where_text(result, no_kernel=own.measured.decl.identity, incumbent=own.measured.incumbent)


def _ranges(axis: Axis, passing: list[bool | None]) -> str:
    """Where along one row of the grid the points pass, in words ("at >= ~10 req/s", "at 2-8 req/s", "nowhere")."""
    xs = [axis.values[i] for i, ok in enumerate(passing) if ok]
    if not xs:
        return ""
    if len(xs) == len(axis.values):
        return f"at every {axis.title.split(' (')[0]} ({axis.label(axis.values[0])} to {axis.label(axis.values[-1])})"
    first, last = axis.values.index(xs[0]), axis.values.index(xs[-1])
    contiguous = last - first + 1 == len(xs)
    if contiguous and last == len(axis.values) - 1:
        return f"at >= ~{axis.label(xs[0])}"
    if contiguous and first == 0:
        return f"at <= ~{axis.label(xs[-1])}"
    if contiguous:
        return f"at ~{axis.label(xs[0])} to ~{axis.label(xs[-1])}"
    return "at " + ", ".join(axis.label(x) for x in xs)


def _region(result: RegimeResult, value: Callable[[GridPoint], bool | None]) -> tuple[list[str], list[str]]:
    """Where along each row of the grid the points pass, rows with the same range said once ("eth-25g, eth-100g at
    >= ~8 req/s"); and the rows where none does."""
    regime = result.regime
    by_range: dict[str, list[str]] = {}
    nowhere = []
    for row in result.grid:
        text = _ranges(regime.x, [value(p) for p in row])
        if text:
            by_range.setdefault(text, []).append(regime.y.label(row[0].y))
        else:
            nowhere.append(regime.y.label(row[0].y))
    if by_range and not nowhere and list(by_range) == [_ranges(regime.x, [True] * len(regime.x.values))]:
        return ["the whole grid"], []
    return [f"{', '.join(ys)} {text}" for text, ys in by_range.items()], nowhere


def where_text(result: RegimeResult, *, no_kernel: bool = False, incumbent: str | None = None) -> str:
    """The region in a sentence, from the model's grid (axes as the map has them), with the live points' count.
    `no_kernel`: the row's kernel is the identity (only where the flow is link-bound is said); `incumbent`: what
    already does the job where it passes."""
    regime = result.regime
    if result.gap is not None:
        return f"not mapped: {result.gap}"
    verdict_word = "passes all five" + (f" (and exists: {incumbent.split(':')[0]})" if incumbent else "")
    where, nowhere = _region(result, lambda p: None if no_kernel else p.passes)
    y_title = regime.y.title.split(" (")[0]
    if where:
        text = f"{verdict_word} on " + "; ".join(where)
        if nowhere:
            text += f"; nowhere on {', '.join(nowhere)}"
    elif no_kernel:
        text = "no kernel: nothing on the link to judge anywhere"
    else:
        failing = result.fixed_failing
        text = (f"nowhere on the grid ({', '.join(failing)} fail{'s' if len(failing) == 1 else ''} at every point)"
                if failing else "nowhere on the grid")
    link_bound, _ = _region(result, lambda p: p.model.passed.get("bottleneck"))
    if link_bound and link_bound != where:
        text += "; link-bound (bottleneck passes) on " + "; ".join(link_bound)
    elif not link_bound and "bottleneck" in regime.varies:
        text += f"; link-bound on no {y_title}"
    live = list(result.live)
    if live:
        agree = sum(1 for p in live if p.agrees(regime.varies))
        unfaithful = sum(1 for p in live if not p.faithful)
        text += (f" (model; {len(live)} live point{'s' if len(live) != 1 else ''}, {agree} as modelled"
                 + (f", {unfaithful} not faithful" if unfaithful else "") + ")")
    return text
