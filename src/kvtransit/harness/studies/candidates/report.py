"""The candidate table as files: DIR/candidates.md, DIR/candidates.json and a one-glance PNG heat-map
(DIR/candidates.png: pass / fail / not measured per test and the verdict; matplotlib, the plots extra).

Each row's cells come from `harness/studies/candidates/table.py: RowVerdict`, its provenance (scale, dilation, faithful,
command, run directory, what was measured and what modelled) from `harness/studies/candidates/run.py: RowRun`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kvtransit.harness.studies.candidates.rows import all_rows
from kvtransit.harness.studies.candidates.run import RowRun
from kvtransit.harness.studies.candidates.table import Unknowns
from kvtransit.harness.studies.candidates.verdicts import RowVerdict
from kvtransit.model.judge.five_tests import TEST_NAMES, Judgement
from kvtransit.report.finite import finite_json

PASS, FAIL, NOT_MEASURED_CELL = "pass", "FAIL", "not measured"
FAITHFUL_NOTE = ("faithful: whether the row's run held the model (the report's fidelity checks for the KV runs; the "
                 "step, prompt, cold start or TTFT within the emulator's band of the model for the collectives, ring "
                 "attention, selection and weights; the link time for the ciphertexts); a verdict that rests "
                 "on a run that was not faithful is not settled: run the row again on a quieter machine (its command "
                 "below).")
FLIP_COLUMNS = ("module budget", "transform", "precision bits", "link")


def cell(test: Judgement) -> str:
    word = PASS if test.passed is True else FAIL if test.passed is False else NOT_MEASURED_CELL
    return word + (" (modelled)" if test.values.get("modelled") else "")


def row_cells(verdict: RowVerdict, link_to: str = "") -> list[str]:
    """The five tests' cells; with `link_to` (an anchor) each is a link to it: the section with the figures
    measured, the run's directory and its command."""
    if verdict.tests is None:
        return ["-"] * len(TEST_NAMES)
    return [f"[{cell(t)}](#{link_to})" if link_to else cell(t) for t in verdict.tests.tests]


def _heading(verdict: RowVerdict) -> str:
    return f"{verdict.row.name}: {verdict.verdict}"


def anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule: lower case, punctuation but - and _
    dropped, spaces to -)."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def _num(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def unknowns_text(u: Unknowns) -> str:
    return (f"module budget {u.module_budget:g} ops/line B, transform "
            f"{'each kernel its own' if u.transform_charged is None else 'charged' if u.transform_charged else 'free'},"
            f" analogue path {'exact' if u.precision_bits is None else f'{u.precision_bits} bits'}, link "
            f"{u.link or 'each row its own'}")


def table_json(verdicts: list[RowVerdict], runs: list[RowRun], u: Unknowns, command: str) -> dict[str, Any]:
    rows = []
    for verdict, run in zip(verdicts, runs, strict=True):
        rows.append({**verdict.as_dict(), "link": verdict.row.link, "flow": all_rows()[verdict.row.name].candidate.flow,
                     "tolerance": all_rows()[verdict.row.name].candidate.tolerance, "run": run.as_dict()})
    unknowns = {"module_budget": u.module_budget, "transform_charged": u.transform_charged,
                "precision_bits": u.precision_bits, "link": u.link}
    return finite_json({"command": command, "unknowns": unknowns,
            "rule": "candidate: all five pass; promising: exactly one measured failure that one change of a stated "
                    "unknown (budget, transform, precision bits, link) turns into five passes; no kernel: its kernel "
                    "moves no byte and computes nothing (an identity); not a candidate: otherwise; 'not measured' "
                    "never passes (harness/studies/candidates/table.py)",
            "rows": rows})


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(verdicts: list[RowVerdict], runs: list[RowRun], u: Unknowns, command: str, *,
                   png_note: str) -> str:
    lines = ["# The candidate table, measured live (docs/reference.md §8)", "", "Made by:", "", "```", command, "```",
             "",
             (f"Judged under: {unknowns_text(u)}. The rule (harness/studies/candidates/table.py): **candidate** = all "
             "five tests pass; **promising** = exactly one measured failure, and one change of a stated unknown "
             "(module budget, transform charged/free, precision bits, or the link from the catalogue) makes all five "
             "pass when the row is judged again with its own measured figures; **no kernel** = the row's kernel moves "
             "no byte off the link and computes nothing (an identity: there is nothing on the link to judge); **not "
             "a candidate** otherwise; a "
             "test \"not measured\" never passes. \"(modelled)\": the figure comes from the model (the row's section "
             "says what was measured and what modelled). Each cell links to its row's section: the figures measured, "
             "the run's directory and the command that reproduces it."), "",
             "| candidate | kernel | " + " | ".join(TEST_NAMES) + " | verdict | link | faithful | run |",
             "|---|---|" + "---|" * len(TEST_NAMES) + "---|---|---|---|"]
    for verdict, run in zip(verdicts, runs, strict=True):
        where = f"`{run.run_dir}`" if run.run_dir else "-"
        section = anchor(_heading(verdict))
        lines.append(f"| [{verdict.row.name}](#{section}) | {_md_escape(verdict.row.decl.name)} | "
                     + " | ".join(row_cells(verdict, section)) + f" | **[{verdict.verdict}](#{section})** | "
                     f"{verdict.row.link or '-'} | {run.faithful.split(' (')[0]} | {where} |")
    lines += ["", FAITHFUL_NOTE, "", png_note, "", "## Why each verdict", ""]
    for verdict, run in zip(verdicts, runs, strict=True):
        candidate = all_rows()[verdict.row.name].candidate
        lines += [f"### {_heading(verdict)}", "", f"{_md_escape(verdict.why)}.", "",
                  f"- flow: {candidate.flow}; kernel: {candidate.kernel}",
                  f"- measured: {run.measured_what}", f"- modelled: {run.modelled_what}",
                  (f"- scale {_num(run.scale, '.4g')}, dilation {_num(run.dilation, 'g')}, faithful: {run.faithful}; "
                  f"{run.elapsed_s:.0f} s"),
                  f"- run: {f'`{run.run_dir}`' if run.run_dir else 'none (not run)'}; command: `{run.command}`",
                  *(f"- note: {n}" for n in verdict.row.notes)]
        if verdict.tests is not None:
            lines += ["", "| test | passed | measured | target | reason |", "|---|---|---|---|---|"]
            lines += [f"| {t.test} | {cell(t)} | {_md_escape(t.measured)} | {_md_escape(t.target)} | "
                      f"{_md_escape(t.reason)} |" for t in verdict.tests.tests]
        lines.append("")
    lines += ["## What would flip each verdict", "",
              ("Per unknown, the nearest change that changes the verdict, found by judging the row again with its "
               "measured figures (harness/studies/candidates/table.py: verdict_flips); where no change of it does, "
               "the nearest that leaves fewer tests failing (\"still ...\"). \"-\": no change of that unknown does "
               "either."),
              "", "| candidate | verdict | module budget | transform | precision bits | link |",
              "|---|---|---|---|---|---|"]
    for verdict in verdicts:
        by = {f.unknown: f for f in verdict.flips}

        def flip_text(unknown: str, by: dict = by) -> str:
            f = by.get(unknown)
            return "-" if f is None else _md_escape(f.describe())

        lines.append(f"| {verdict.row.name} | {verdict.verdict} | "
                     + " | ".join(flip_text(k) for k in FLIP_COLUMNS) + " |")
    lines += ["", "## Reproducing each row", ""]
    for verdict, run in zip(verdicts, runs, strict=True):
        lines += [f"- {verdict.row.name}: `{run.command}`"]
    return "\n".join(lines) + "\n"


PNG_SKIPPED = "heat-map skipped: plots need matplotlib (pip install 'kvtransit[plots]')"


def draw_heatmap(verdicts: list[RowVerdict], path: Path) -> bool:
    """The PNG at `path`; False when matplotlib is missing (the plots extra)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    code = {PASS: 2, FAIL: 0, NOT_MEASURED_CELL: 1, "-": 1}
    grid = [[code[c.removesuffix(" (modelled)")] for c in row_cells(v)] for v in verdicts]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(verdicts) + 1.6))
    ax.imshow(grid, cmap=ListedColormap(["#d9534f", "#bbbbbb", "#5cb85c"]), vmin=0, vmax=2, aspect="auto")
    ax.set_xticks(range(len(TEST_NAMES)), TEST_NAMES)
    ax.set_yticks(range(len(verdicts)), [f"{v.row.name}: {v.verdict}" for v in verdicts])
    for i, v in enumerate(verdicts):
        for j, c in enumerate(row_cells(v)):
            ax.text(j, i, c.replace(" (modelled)", "\n(modelled)"), ha="center", va="center", fontsize=7)
    ax.set_title("candidates: five tests (green pass, red fail, grey not measured / not run)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_table(out_dir: Path, verdicts: list[RowVerdict], runs: list[RowRun], u: Unknowns,
                command: str) -> dict[str, str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "candidates.png"
    drawn = draw_heatmap(verdicts, png)
    png_note = f"![the five tests per candidate]({png.name})" if drawn else PNG_SKIPPED
    (out_dir / "candidates.md").write_text(table_markdown(verdicts, runs, u, command, png_note=png_note))
    (out_dir / "candidates.json").write_text(json.dumps(table_json(verdicts, runs, u, command), indent=1,
                                                        default=str) + "\n")
    return {"markdown": str(out_dir / "candidates.md"), "json": str(out_dir / "candidates.json"),
            "png": str(png) if drawn else PNG_SKIPPED}
