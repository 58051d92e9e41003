"""The candidate table as files, and the evidence behind every cell, all inside DIR:

- DIR/candidates.md: the table (each test's word, figure and what it rests on; the verdict; where its kernel passes;
  the deck's verdict beside it), why each verdict, each regime and its live points, what would flip each verdict;
- DIR/candidates.json: the same as data; DIR/candidates-spec.md: the break-even module of each flow (spec.py);
- DIR/candidates.png: a one-glance heat-map of the five tests (matplotlib, the plots extra);
- DIR/candidates/<row>/: the row's evidence: `row.json` (its figures, tests and its run's small report, never raw
  ledgers), `map.png` (its regime's heat-map with the live points), `points/<point>.json` (each live point's run).

Every cell of the table links to a file written here (`row.json`, `map.png`) or to a section of candidates.md; the
committed table's links are held to resolve by a test.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from kvtransit.harness.studies.candidates.regimes import RegimeResult
from kvtransit.harness.studies.candidates.rows import RowRun, all_rows
from kvtransit.harness.studies.candidates.table import Unknowns
from kvtransit.harness.studies.candidates.verdicts import RowVerdict, against_deck
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE, TEST_NAMES, Judgement, percent
from kvtransit.report.finite import finite_json

PASS, FAIL, NOT_MEASURED_CELL = "pass", "FAIL", "not measured"
FAITHFUL_NOTE = ("faithful: whether the row's run held the model (the report's fidelity checks for the KV runs; the "
                 "step, prompt, cold start or TTFT within the emulator's band of the model for the collectives, ring "
                 "attention, selection and weights; the link time for the ciphertexts). A row whose own run, or a "
                 "live point of its regime, was not faithful is \"not settled\": its tests are shown, its verdict is "
                 "not given (run it again on a quieter machine: its command below).")
FLIP_COLUMNS = ("module budget", "transform", "precision bits", "link")
EVIDENCE_DIR = "candidates"


def cell(test: Judgement) -> str:
    """A test's cell: its word and its figure, the figure tagged with what it rests on."""
    word = PASS if test.passed is True else FAIL if test.passed is False else NOT_MEASURED_CELL
    return word if test.measured == "-" else f"{word} {test.measured}"


def word(test: Judgement) -> str:
    return PASS if test.passed is True else FAIL if test.passed is False else NOT_MEASURED_CELL


def row_cells(verdict: RowVerdict, link_to: str = "") -> list[str]:
    """The five tests' cells; with `link_to` (a path relative to the table) each is a link to it."""
    if verdict.tests is None:
        return ["-"] * len(TEST_NAMES)
    return [f"[{_md(cell(t))}]({link_to})" if link_to else cell(t) for t in verdict.tests.tests]


def _heading(verdict: RowVerdict) -> str:
    return f"{verdict.row.name}: {verdict.verdict}"


def anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule: lower case, punctuation but - and _
    dropped, spaces to -)."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def _num(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def unknowns_text(u: Unknowns) -> str:
    return (f"module budget {u.module_budget:g} ops/line B, transform "
            f"{'each kernel its own' if u.transform_charged is None else 'charged' if u.transform_charged else 'free'},"
            f" analogue path {'exact' if u.precision_bits is None else f'{u.precision_bits} bits'}, link "
            f"{u.link or 'each row its own'}")


def _deck(name: str) -> tuple[str | None, str]:
    deck = all_rows()[name].deck
    return (None, "-") if deck is None else (deck.verdict, deck.says)


# --- the regime as data --------------------------------------------------------------------------------------------

def regime_json(result: RegimeResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    r = result.regime
    return {"x": {"key": r.x.key, "title": r.x.title, "values": list(r.x.values)},
            "y": {"key": r.y.key, "title": r.y.title, "values": list(r.y.values)},
            "model": r.model, "gap": result.gap, "decides": result.decides, "varies": list(r.varies),
            "fixed_failing": list(result.fixed_failing), "where": result.where,
            "grid": [[{"x": p.x, "y": p.y, "share": p.model.share, "passed": p.model.passed, "passes": p.passes,
                       "note": p.model.note} for p in row] for row in result.grid],
            "frontier": [[list(a), list(b)] for a, b in result.frontier],
            "live": [_live_json(p, r.varies) for p in result.live]}


def _live_json(p: Any, varies: tuple[str, ...]) -> dict[str, Any]:
    return {"x": p.x, "y": p.y, "label": p.label, "own": p.own, "faithful": p.run.faithful, "share": p.share,
            "verdict": p.verdict.verdict, "passed": {t: p.live_passed(t) for t in varies},
            "model_share": p.model.share if p.model else None,
            "model_passed": p.model.passed if p.model else None, "agrees": p.agrees(varies),
            "scale": p.run.scale, "dilation": p.run.dilation, "command": p.run.command,
            "evidence": None if p.own else f"points/{p.label}.json"}


def table_json(verdicts: list[RowVerdict], runs: list[RowRun], u: Unknowns, command: str,
               wall_s: float | None = None, spec: list[Any] | None = None) -> dict[str, Any]:
    rows = []
    for verdict, run in zip(verdicts, runs, strict=True):
        deck, says = _deck(verdict.row.name)
        rows.append({**verdict.as_dict(), "link": verdict.row.link, "flow": all_rows()[verdict.row.name].candidate.flow,
                     "tolerance": all_rows()[verdict.row.name].candidate.tolerance, "run": run.as_dict(),
                     "deck": {"verdict": deck, "says": says, "differs": against_deck(verdict, deck)},
                     "regime": regime_json(run.regime),
                     "evidence": f"{EVIDENCE_DIR}/{verdict.row.name}/row.json"})
    unknowns = {"module_budget": u.module_budget, "transform_charged": u.transform_charged,
                "precision_bits": u.precision_bits, "link": u.link}
    return finite_json({"command": command, "wall_s": wall_s, "unknowns": unknowns,
            "rule": "candidate: all five pass; promising: exactly one measured failure that one change of a stated "
                    "unknown (budget, transform, precision bits, link) turns into five passes; exists: either of "
                    "those where an incumbent already does the job; no kernel: its kernel moves no byte and computes "
                    "nothing (an identity); not settled: a live run it rests on was not faithful; not a candidate: "
                    "otherwise; 'not measured' never passes (harness/studies/candidates/verdicts.py)",
            "rows": rows, "spec": [b.as_dict() for b in spec or []]})


# --- Markdown -----------------------------------------------------------------------------------------------------

def _where_short(run: RowRun) -> str:
    result = run.regime
    if result is None:
        return "-"
    return result.where


def table_markdown(verdicts: list[RowVerdict], runs: list[RowRun], u: Unknowns, command: str, *, png_note: str,
                   wall_s: float | None = None, maps: dict[str, bool] | None = None,
                   spec_file: str | None = None) -> str:
    maps = maps or {}
    wall = f" ({wall_s / 60:.1f} min on this 2-core box)" if wall_s else ""
    lines = ["# The candidate table, measured live (docs/reference.md §8)", "", f"Made by{wall}:", "", "```", command,
             "```", "",
             (f"Judged under: {unknowns_text(u)}. The rule (harness/studies/candidates/verdicts.py): **candidate** = "
              "all five tests pass; **promising** = exactly one measured failure, and one change of a stated unknown "
              "(module budget, transform charged/free, precision bits, or the link from the catalogue) makes all "
              "five pass when the row is judged again with its own measured figures; **exists** = either, where an "
              "incumbent already does the job; **no kernel** = the row's kernel moves no byte off the link and "
              "computes nothing; **not settled** = a live run it rests on was not faithful (its tests shown, no "
              "verdict); **not a candidate** otherwise; a test \"not measured\" never passes."),
             "",
             ("Each test's cell gives its word and its figure, and says what the figure rests on: **measured** on "
              "the row's live run, **modelled** (the model's figure), **declared** (a kernel declaration's "
              "arithmetic, or what a flow is by construction), or **measured × modelled** (a measured figure with "
              "a modelled factor in it: the section says which). Every cell links to the row's evidence in this "
              "repository (`candidates/<row>/row.json`: its figures, tests and run report); the verdict to the "
              "row's section; *where* to its regime's heat-map (`candidates/<row>/map.png`); the deck's verdict "
              "(slide 11) to docs/reference.md §8.5."),
             "",
             "| candidate | kernel | " + " | ".join(TEST_NAMES) + " | verdict | where (regime) | deck (slide 11) "
             "| link | faithful |",
             "|---|---|" + "---|" * len(TEST_NAMES) + "---|---|---|---|---|"]
    for verdict, run in zip(verdicts, runs, strict=True):
        name = verdict.row.name
        evidence = f"{EVIDENCE_DIR}/{name}/row.json"
        section = anchor(_heading(verdict))
        deck, says = _deck(name)
        where_link = f"{EVIDENCE_DIR}/{name}/map.png" if maps.get(name) else evidence
        lines.append(f"| [{name}](#{section}) | {_md(verdict.row.decl.name)} | "
                     + " | ".join(row_cells(verdict, evidence)) + f" | **[{verdict.verdict}](#{section})** | "
                     f"[{_md(_where_short(run))}]({where_link}) | "
                     f"[{deck or '-'}](../reference.md): \"{_md(says)}\" | {verdict.row.link or '-'} | "
                     f"[{run.faithful.split(' (')[0]}]({evidence}) |")
    lines += ["", FAITHFUL_NOTE, "", png_note, ""]
    if spec_file:
        lines += [f"The break-even module of each flow (what the hardware would need): [{spec_file}]({spec_file}).",
                  ""]
    lines += _deck_section(verdicts)
    lines += ["## Why each verdict", ""]
    for verdict, run in zip(verdicts, runs, strict=True):
        lines += _row_section(verdict, run, maps.get(verdict.row.name, False))
    lines += _flips_section(verdicts)
    lines += ["## Reproducing each row", ""]
    for verdict, run in zip(verdicts, runs, strict=True):
        lines += [f"- {verdict.row.name}: `{run.command}`"]
    return "\n".join(lines) + "\n"


def _deck_section(verdicts: list[RowVerdict]) -> list[str]:
    lines = ["## The deck beside the measurement", "",
             ("The deck's verdict on each row (slide 11, docs/reference.md §8.5) beside the measured one; where they "
              "differ, the figure that decides it (the failing tests' measured figures against their targets, or "
              "what else settles the row)."), "",
             "| candidate | measured | deck (slide 11) | the deck says | the figure that decides it |",
             "|---|---|---|---|---|"]
    for v in verdicts:
        deck, says = _deck(v.row.name)
        differs = against_deck(v, deck)
        lines.append(f"| {v.row.name} | {v.verdict} | {deck or '-'} | {_md(says)} | "
                     f"{_md(differs) if differs else 'agree'} |")
    return [*lines, ""]


def _row_section(verdict: RowVerdict, run: RowRun, has_map: bool) -> list[str]:
    r = verdict.row
    candidate = all_rows()[r.name].candidate
    evidence = f"{EVIDENCE_DIR}/{r.name}"
    lines = [f"### {_heading(verdict)}", "", f"{_md(verdict.why)}.", "",
             f"- rests on: {verdict.rests_on}",
             f"- flow: {candidate.flow}; kernel: {candidate.kernel}",
             f"- measured: {run.measured_what}", f"- modelled: {run.modelled_what}",
             f"- compute basis (the time that is not the link's): {r.compute_basis or '-'}"]
    if verdict.tests is not None:
        sens = verdict.tests.tests[0].values.get("sensitivity")
        if sens:
            held = verdict.tests.tests[0].values.get("holds_across_compute")
            lines.append("- sensitivity: the share at " + ", ".join(f"{k}x: {percent(v)}" for k, v in sens.items())
                         + " that time; the bottleneck's verdict " + ("holds across them" if held else
                                                                       "turns on it"))
    if r.incumbent:
        lines.append(f"- incumbent: {r.incumbent}")
    for placed in r.placement_runs:
        lines.append(f"- placement elsewhere: {word(placed)}: {_md(placed.measured)}: {_md(placed.reason)}")
    lines += [(f"- scale {_num(run.scale, '.4g')}, dilation {_num(run.dilation, 'g')}, faithful: {run.faithful}; "
               f"{run.elapsed_s:.0f} s (with its regime's live points)"),
              f"- evidence: [{evidence}/row.json]({evidence}/row.json); command: `{run.command}`",
              *(f"- note: {_md(n)}" for n in r.notes)]
    if verdict.tests is not None:
        lines += ["", "| test | passed | measured | target | reason |", "|---|---|---|---|---|"]
        lines += [f"| {t.test} | {word(t)} | {_md(t.measured)} | {_md(t.target)} | {_md(t.reason)} |"
                  for t in verdict.tests.tests]
    if run.regime is not None:
        lines += ["", *_regime_lines(run.regime, evidence, has_map)]
    return [*lines, ""]


def _regime_lines(result: RegimeResult, evidence: str, has_map: bool) -> list[str]:
    r = result.regime
    lines = [f"**Regime** ({r.x.title} × {r.y.title}): {_md(result.where)}.", "",
             f"- model: {r.model}" + (f" (not mapped: {result.gap})" if result.gap else ""),
             f"- the frontier is of: {result.decides}; tests the axes do not move, from the row's run: "
             + (", ".join(result.fixed_failing) + " fail" if result.fixed_failing else "all pass")]
    if has_map:
        lines.append(f"- heat-map: [{evidence}/map.png]({evidence}/map.png)")
    if result.live:
        lines += ["", ("| live point | faithful | share live | share modelled | live / model "
                       "| as modelled | verdict | scale / dilation | evidence |"),
                  "|---|---|---|---|---|---|---|---|---|"]
        for p in result.live:
            where = f"{r.x.label(p.x)}, {r.y.label(p.y)}" + (" (the row's own run)" if p.own else "")
            passed = "; ".join(f"{t} {_pf(p.live_passed(t))} / {_pf(p.model.passed.get(t) if p.model else None)}"
                               for t in r.varies)
            agree = p.agrees(r.varies)
            file = f"{evidence}/row.json" if p.own else f"{evidence}/points/{p.label}.json"
            lines.append(f"| {where} | {p.run.faithful.split(' (')[0]} | {_pc(p.share)} | "
                         f"{_pc(p.model.share if p.model else None)} | {passed} | "
                         f"{'-' if agree is None else 'yes' if agree else 'NO'} | {p.verdict.verdict} | "
                         f"{_num(p.run.scale, '.4g')} / {_num(p.run.dilation, 'g')} | [{file}]({file}) |")
    return lines


def _pc(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else percent(value)


def _pf(value: bool | None) -> str:
    return "-" if value is None else PASS if value else FAIL


def _flips_section(verdicts: list[RowVerdict]) -> list[str]:
    lines = ["## What would flip each verdict", "",
             ("Per unknown, the nearest change that changes the verdict, found by judging the row again with its "
              "measured figures (harness/studies/candidates/verdicts.py: verdict_flips); where no change of it does, "
              "the nearest that leaves fewer tests failing (\"still ...\"). \"-\": no change of that unknown does "
              "either."),
             "", "| candidate | verdict | module budget | transform | precision bits | link |",
             "|---|---|---|---|---|---|"]
    for verdict in verdicts:
        by = {f.unknown: f for f in verdict.flips}
        cells = ["-" if (f := by.get(k)) is None else _md(f.describe()) for k in FLIP_COLUMNS]
        lines.append(f"| {verdict.row.name} | {verdict.verdict} | " + " | ".join(cells) + " |")
    return [*lines, ""]


# --- the spec sheet -------------------------------------------------------------------------------------------

def spec_markdown(sheet: list[Any], module: Any = None, command: str = "kvtransit candidates --spec") -> str:
    from kvtransit.harness.studies.candidates.spec import meets

    lines = ["# What the hardware would need: the break-even module of each flow", "", "Made by:", "", "```",
             command, "```", "",
             ("For one event of each flow, the module at which the kernel in transit is no slower and spends no more "
              "energy than the better of the same kernel on the GPU and no kernel on the next faster link "
              "(harness/studies/candidates/spec.py; every figure is the model's: docs/reference.md §2, §3, §5, §7, "
              "with the precision bits from the measured task-level loss where the kernel is lossy). Each figure "
              "alone, the others at the simulator's stage (1.6 ops per line byte, 1 pJ per input bit, 1 µs). "
              "\"none\": no value of that figure does it (why in the notes)."), "",
             "| flow | event | link → faster | kernel (ratio) | needs ops/line B ≥ | pJ/bit ≤ | added latency ≤ "
             "| precision bits | needs published | beaten by | at the sim's stage |"
             + (" this module |" if module is not None else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if module is not None else "")]
    for be in sheet:
        c = be.case
        if c.no_kernel:
            lines.append(f"| {be.flow} | {_md(c.event)} | {c.link} | {_md(c.kernel)} | - | - | - | - | - | - | "
                         f"no kernel |" + (" - |" if module is not None else ""))
            continue
        lat = "none" if be.latency_s is None else f"{max(0.0, round(be.latency_s, 12)) * 1e6:,.3g} µs"
        ops = "none" if be.ops_per_line_byte is None else f"{be.ops_per_line_byte:.3g}"
        pj = ("-" if be.target_j is None else "none") if be.pj_per_bit is None else f"{be.pj_per_bit:.3g}"
        sim = "-" if be.at_sim is None else "beats both" if be.at_sim else "no"
        lines.append(f"| {be.flow} | {_md(c.event)} | {c.link} → {c.faster or '-'} | {_md(c.kernel)} ({c.ratio:.3g}) "
                     f"| {ops} | {pj} | {lat} | {_md(c.bits)} | {', '.join(c.unpublished) or '-'} | "
                     f"{_md(be.beaten_by)} | {sim} |" + (f" {meets(be, module)} |" if module is not None else ""))
    lines += ["", "Notes:", ""]
    for be in sheet:
        notes = [f"{k}: {v}" for k, v in be.why_none.items()] + ([be.case.note] if be.case.note else [])
        gpu = "-" if be.case.gpu_s is None else f"{be.case.gpu_s * 1e3:.4g} ms"
        fast = "-" if be.case.faster_s is None else f"{be.case.faster_s * 1e3:.4g} ms"
        if be.case.no_kernel:
            lines.append(f"- {be.flow}: {be.case.no_kernel}")
            continue
        lines.append(f"- {be.flow}: in transit at the sim's stage "
                     f"{be.case.transit_s(1.6, 1e-6) * 1e3:.4g} ms; {be.case.gpu_what}: {gpu}; the next faster link "
                     f"({be.case.faster or '-'}): {fast}" + ("; " + "; ".join(_md(n) for n in notes) if notes else ""))
    return "\n".join(lines) + "\n"


# --- figures ------------------------------------------------------------------------------------------------------

PNG_SKIPPED = "heat-map skipped: plots need matplotlib (pip install 'kvtransit[plots]')"


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_heatmap(verdicts: list[RowVerdict], path: Path) -> bool:
    """The five tests at a glance at `path`; False when matplotlib is missing (the plots extra)."""
    plt = _plt()
    if plt is None:
        return False
    from matplotlib.colors import ListedColormap

    code = {PASS: 2, FAIL: 0, NOT_MEASURED_CELL: 1}
    grid = [[code[word(t)] for t in v.tests.tests] if v.tests else [1] * len(TEST_NAMES) for v in verdicts]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(verdicts) + 1.6))
    ax.imshow(grid, cmap=ListedColormap(["#d9534f", "#bbbbbb", "#5cb85c"]), vmin=0, vmax=2, aspect="auto")
    ax.set_xticks(range(len(TEST_NAMES)), TEST_NAMES)
    ax.set_yticks(range(len(verdicts)), [f"{v.row.name}: {v.verdict}" for v in verdicts])
    for i, v in enumerate(verdicts):
        for j, t in enumerate(v.tests.tests if v.tests else []):
            ax.text(j, i, f"{word(t)}\n({t.values.get('basis', '-')})", ha="center", va="center", fontsize=6)
    ax.set_title("candidates: five tests (green pass, red fail, grey not measured / not run)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def draw_regime(name: str, result: RegimeResult, path: Path) -> bool:
    """The regime's heat-map: the modelled share at every grid point (the bottleneck's 10 % line between green and
    grey), a tick where all five pass, the live points as circles (filled: as modelled; open: not; a cross: not
    faithful). False without matplotlib, or with nothing mapped."""
    plt = _plt()
    if plt is None or result.gap is not None:
        return False
    import numpy as np

    r = result.regime
    share = np.array([[np.nan if p.model.share is None else p.model.share for p in row] for row in result.grid])
    fig, ax = plt.subplots(figsize=(1.1 * len(r.x.values) + 5, 0.6 * len(r.y.values) + 2.6))
    im = ax.imshow(share * 100, cmap="viridis", aspect="auto", origin="lower", vmin=0,
                   vmax=max(20.0, float(np.nanmax(share)) * 100 if np.isfinite(share).any() else 20.0))
    fig.colorbar(im, ax=ax, label="flow's share, % (model)")
    for j, row in enumerate(result.grid):
        for i, p in enumerate(row):
            text = "-" if p.model.share is None else percent(p.model.share)
            mark = "\n✓ all five" if p.passes else ("\nlink-bound" if p.model.passed.get("bottleneck") else "")
            ax.text(i, j, text + mark, ha="center", va="center", fontsize=7,
                    color="white" if (p.model.share or 0) < BOTTLENECK_MIN_SHARE * 2 else "black")
    for live in result.live:
        i, j = r.x.values.index(live.x), r.y.values.index(live.y)
        agrees = live.agrees(r.varies)
        if not live.faithful:
            ax.plot(i, j, marker="x", color="red", markersize=18, mew=3)
        else:
            ax.plot(i, j, marker="o", markersize=26, mfc="none", mec="red" if agrees is False else "black",
                    mew=2.5)
    from matplotlib.lines import Line2D

    ax.legend(handles=[Line2D([], [], marker="o", ls="", mfc="none", mec="black", mew=2, label="live, as modelled"),
                       Line2D([], [], marker="o", ls="", mfc="none", mec="red", mew=2, label="live, not as modelled"),
                       Line2D([], [], marker="x", ls="", color="red", mew=2, label="live, not faithful")],
              loc="upper left", bbox_to_anchor=(1.25, 1.0), fontsize=7, frameon=False)
    ax.set_xticks(range(len(r.x.values)), [r.x.label(v) for v in r.x.values], rotation=30, fontsize=7)
    ax.set_yticks(range(len(r.y.values)), [r.y.label(v) for v in r.y.values], fontsize=7)
    ax.set_xlabel(r.x.title)
    ax.set_ylabel(r.y.title)
    import textwrap

    ax.set_title(textwrap.fill(f"{name}: {result.where}", 110), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --- writing it all -------------------------------------------------------------------------------------------

def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite_json(data), indent=1, default=str) + "\n")


def write_evidence(out_dir: Path, verdict: RowVerdict, run: RowRun) -> bool:
    """The row's evidence under OUT/candidates/<row>/: row.json, each live point's JSON, and its regime's map (True
    when drawn)."""
    name = verdict.row.name
    where = out_dir / EVIDENCE_DIR / name
    if where.is_dir():  # this run's evidence only: a live point an earlier run had is not this row's any more
        shutil.rmtree(where)
    deck, says = _deck(name)
    _write_json(where / "row.json", {**verdict.as_dict(), "run": run.as_dict(), "report": run.evidence,
                                     "deck": {"verdict": deck, "says": says, "differs": against_deck(verdict, deck)},
                                     "regime": regime_json(run.regime)})
    drawn = False
    if run.regime is not None:
        for p in run.regime.live:
            if not p.own:
                _write_json(where / "points" / f"{p.label}.json",
                            {"point": {run.regime.regime.x.key: p.x, run.regime.regime.y.key: p.y},
                             **p.verdict.as_dict(), "run": p.run.as_dict(), "report": p.run.evidence})
        drawn = draw_regime(name, run.regime, where / "map.png")
    return drawn


def write_table(out_dir: Path, verdicts: list[RowVerdict], runs: list[RowRun], u: Unknowns, command: str, *,
                wall_s: float | None = None, spec: list[Any] | None = None) -> dict[str, str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "candidates.png"
    drawn = draw_heatmap(verdicts, png)
    png_note = f"![the five tests per candidate]({png.name})" if drawn else PNG_SKIPPED
    maps = {v.row.name: write_evidence(out_dir, v, r) for v, r in zip(verdicts, runs, strict=True)}
    spec_file = None
    if spec is not None:
        spec_file = "candidates-spec.md"
        (out_dir / spec_file).write_text(spec_markdown(spec, command=command))
    (out_dir / "candidates.md").write_text(table_markdown(verdicts, runs, u, command, png_note=png_note,
                                                          wall_s=wall_s, maps=maps, spec_file=spec_file))
    (out_dir / "candidates.json").write_text(json.dumps(table_json(verdicts, runs, u, command, wall_s, spec),
                                                        indent=1, default=str) + "\n")
    return {"markdown": str(out_dir / "candidates.md"), "json": str(out_dir / "candidates.json"),
            "png": str(png) if drawn else PNG_SKIPPED, "evidence": str(out_dir / EVIDENCE_DIR)}
