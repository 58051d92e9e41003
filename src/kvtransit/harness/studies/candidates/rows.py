"""The candidate table's rows: what each row is (a `Row`: its candidate, its own link, its place in docs/reference.md
§8's list, the function that measures it), what a measurement is (`RowRun`), and the helpers every row shares.

The core has one row, the KV hand-off (harness/studies/candidates/kv_rows.py); every other row is its flow's
(a flow's `rows.py`: ROWS, reached through the registry, kvtransit/flows/__init__.py), so a new flow brings its own
row. `all_rows()` is the table, in docs/reference.md §8's order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvtransit.harness.studies.candidates.table import Candidate, RowMeasured, Unknowns
from kvtransit.model.errors import unknown_name
from kvtransit.model.judge.fidelity import model_gap
from kvtransit.model.module.budget import MODULE_BUDGETS
from kvtransit.paths import REPO

SAMPLE_TEXT = "prose"  # the real-KV sample's text the rows read


@dataclass
class RowRun:
    measured: RowMeasured
    scale: float | None
    dilation: float | None
    faithful: str  # "yes", "NO: …", or "n/a: …" (offline rows)
    command: str  # the command that reproduces the row's measurement
    run_dir: str | None
    elapsed_s: float = 0.0
    measured_what: str = ""
    modelled_what: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # The run's own small report (its flow's summary, or the run report without its per-request rows and ledgers):
    # what the table commits beside the row as evidence (harness/studies/candidates/report.py).
    evidence: dict[str, Any] = field(default_factory=dict)
    regime: Any = None  # regimes.RegimeResult: the row's regime, mapped and confirmed (None: not asked)

    @property
    def is_faithful(self) -> bool:
        return self.faithful.startswith("yes")

    def as_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "dilation": self.dilation, "faithful": self.faithful, "command": self.command,
                "run_dir": self.run_dir, "elapsed_s": self.elapsed_s, "measured": self.measured_what,
                "modelled": self.modelled_what, "figures": self.extra}


@dataclass(frozen=True)
class RowContext:
    """What a row's run is asked: its row, the table's unknowns, where its run goes, and `point`: the operating
    point's settings where it is run away from its own (a regime's live confirmation: the axis keys of the row's
    `Regime`, e.g. {"rate": 12.0, "link": "eth-25g"}), `label` naming that point's directory."""

    name: str
    unknowns: Unknowns
    runs_dir: Path
    log: Callable[[str], None]
    sample_path: Path
    point: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def link(self) -> str:
        link = self.point.get("link")
        return str(link) if link is not None else self.unknowns.link or all_rows()[self.name].link

    def setting(self, key: str, default: Any) -> Any:
        """The point's value of `key`, else the row's own `default`."""
        return self.point.get(key, default)

    @property
    def run_dir(self) -> Path:
        path = self.runs_dir / self.name / "points" / self.label if self.label else self.runs_dir / self.name
        path.mkdir(parents=True, exist_ok=True)
        return path


# A row's evidence is its run's small report: lists longer than this are summarised by their length (the
# per-request rows, ledgers and step lists stay in the run's directory).
EVIDENCE_MAX_LIST = 24


def small_report(obj: Any, *, max_list: int = EVIDENCE_MAX_LIST) -> Any:
    """`obj` (a run's report or summary) with every list longer than `max_list` replaced by a note of its length,
    and the per-request blocks dropped: what a row commits as evidence (not raw ledgers)."""
    if isinstance(obj, dict):
        return {k: small_report(v, max_list=max_list) for k, v in obj.items()
                if k not in ("per_request", "stages", "requests_detail")}
    if isinstance(obj, list | tuple):
        if len(obj) > max_list:
            return f"({len(obj)} entries: in the run's directory)"
        return [small_report(v, max_list=max_list) for v in obj]
    return obj


def bits_flag(u: Unknowns) -> str:
    return "" if u.precision_bits is None else f" --precision-bits {u.precision_bits}"


def default_sample_path() -> Path:
    """tests/data/smollm2_kv_sample.npz under the working directory, else under the source checkout."""
    here = Path("tests/data/smollm2_kv_sample.npz")
    return here if here.exists() else REPO / "tests" / "data" / here.name


def load_real_kv(ctx: RowContext) -> Any:
    from kvtransit.kernels.accuracy import load_sample

    return load_sample(str(ctx.sample_path))[SAMPLE_TEXT]




@dataclass(frozen=True)
class DeckVerdict:
    """The deck's verdict on a row (slide 11, docs/reference.md §8.5): in the table's words, and the deck's own."""

    verdict: str
    says: str


@dataclass(frozen=True)
class Row:
    """One row of the table: its candidate (what moves, the kernel, the precision test's tolerance), its own link
    when --link does not say, its place in docs/reference.md §8's list, the function that measures it, the deck's
    verdict on it, its regime (the operating conditions it is mapped over, harness/studies/candidates/regimes.py)
    and its break-even module (harness/studies/candidates/spec.py)."""

    candidate: Candidate
    link: str
    order: int
    run: Callable[[RowContext], RowRun]
    deck: DeckVerdict | None = None
    regime: Any = None  # regimes.Regime (typed loosely: regimes.py imports this module)
    spec: Callable[[], Any] | None = None  # () -> spec.SpecCase

    @property
    def name(self) -> str:
        return self.candidate.name


def all_rows() -> dict[str, Row]:
    """Every row, the core's and the flows', in docs/reference.md §8's order."""
    from kvtransit import flows  # the registry only: the core reaches a flow through it, by a string
    from kvtransit.harness.studies.candidates.kv_rows import ROWS as CORE_ROWS

    rows = [*CORE_ROWS, *(row for _, flow_rows in flows.attribute("rows", "ROWS") for row in flow_rows)]
    return {row.name: row for row in sorted(rows, key=lambda r: r.order)}


def candidate_names(text: str | None) -> tuple[str, ...]:
    """`a,b` → the named candidates in table order (None or empty: all); an unknown name lists the valid ones."""
    order = tuple(all_rows())
    if not text:
        return order
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in order:
            raise unknown_name("candidate", name, order)
    return tuple(n for n in order if n in names)


def relative_l2(ref: np.ndarray, got: np.ndarray) -> float:
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    return float(np.linalg.norm(got64 - ref64) / np.linalg.norm(ref64))


def budget_flag(budget: float) -> str:
    """A flow command takes a named budget only; a number has no flag there (the harness passes it)."""
    names = [name for name, value in MODULE_BUDGETS.items() if value == budget]
    return f"--module-budget {names[0]}" if names else f"(module budget {budget:g}: no flag for it)"


def faithful_runs(runs: dict[str, dict[str, Any]]) -> str:
    """`yes (...)` when every live run of a row was faithful (its summary's own verdict), else `NO (` which and
    why `)`."""
    bad = [f"{label}: {s['faithful_line']}" for label, s in runs.items() if not s.get("faithful")]
    if bad:
        return "NO (" + "; ".join(bad)[:300] + ")"
    return "yes (" + ", ".join(f"{label} within the emulator's band of the model" for label in runs) + ")"


def links() -> dict[str, Any]:
    from kvtransit.model.catalog.links import LINKS

    return dict(LINKS)


def not_run(ctx: RowContext, decl: Any, why: str, command: str) -> RowRun:
    row = RowMeasured(ctx.name, decl, None, "-", not_run=f"not run: {why.removeprefix('not installed: ')}"
                      if why.startswith("not installed") else why)
    return RowRun(row, None, None, "n/a: not run", command, None, measured_what="nothing", modelled_what="nothing")


def serial_faithful(measured_s: float, modelled_s: float, dilation: Any, what: str) -> str:
    """A serial flow's fidelity (a ciphertext row): its median link time against the link model, in the live groups'
    band."""
    gap = model_gap(measured_s, modelled_s, dilation.dilation, what)
    return (f"{'yes' if gap.ok else 'NO'} ({what} {gap.measured:+.1%} off the link model at dilation "
            f"{dilation.dilation:g}, {dilation.why}{'' if gap.ok else '; ' + gap.hint})")
