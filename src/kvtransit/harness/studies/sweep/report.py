"""What a sweep's results look like to a reader: Markdown tables laid out like the deck's slide-03 tables
(rows = load, columns = codecs; one table per link × metric) and PNG plots beside the results.

Plots need matplotlib (the `plots` extra); the tables do not. Plots are drawn off-screen (Agg).
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

from kvtransit.harness.studies.sweep.baselines import energy_per_request
from kvtransit.model.judge.slo import TPOT_SLO_S

TWIN = "twin"  # a row's `source` when the twin ran its point (runner.py: TwinPointRunner)

# (row key, table heading, how a value prints)
TABLE_METRICS = (
    ("slo_attainment", "SLO attainment", lambda v: f"{v:.1%}"),
    ("handoff_p99_ms", "hand-off p99 (ms)", lambda v: f"{v:.1f}"),
    ("ttft_p99_ms", "TTFT p99 (ms)", lambda v: f"{v:.1f}"),
    ("tpot_p99_ms", "TPOT p99 (ms)", lambda v: f"{v:.2f}"),
    ("link_busy", "link busy", lambda v: f"{v:.1%}"),
    ("goodput_rps", "goodput (req/s)", lambda v: f"{v:.2f}"),
    ("j_per_token", "J/token", lambda v: f"{v:.3f}"),
    ("j_per_request", "J/request", lambda v: f"{v:.3f}"),
    ("wire_bytes", "wire bytes (GB)", lambda v: f"{v / 1e9:.2f}"),
    ("kv_wait_share", "KV wait + transfer share of E2E", lambda v: f"{v:.1%}"),
    # Layer-wise streaming: of the hand-off's time, the part a user waits for (KV ready − first token); the rest hid
    # behind the prefill (layer-wise streaming, chunked prefill). 100 % in whole mode, the reference model's.
    ("exposed_share", "exposed share of the hand-off", lambda v: f"{v:.1%}"),
    ("placement", "placement (--links)", str),
)
PLOT_FILES = ("slo_attainment.png", "handoff_p99.png", "link_busy.png", "tpot_p99.png")


def with_j_per_request(row: dict) -> dict:
    """The row with `j_per_request` (link + module + GPU [+ pool] J over the requests that finished,
    harness/studies/sweep/baselines.py): the row's own, else worked out from its point's report file (results rows do
    not carry it); None when neither is there or the report cannot be read."""
    if "j_per_request" in row or row.get("status") != "ok":
        return row
    value = None
    # A moved or broken report: the cell prints "-", the other metrics still print.
    with contextlib.suppress(OSError, ValueError):
        value = energy_per_request(json.loads(Path(row["report"]).read_text()))[0] if row.get("report") else None
    return {**row, "j_per_request": value}


def _ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok"]


def _ordered(values) -> list:
    return sorted(set(values), key=lambda v: (isinstance(v, str), v))


def markdown_tables(rows: list[dict]) -> str:
    """One table per link × metric: rows = request rate, columns = codec (where it runs); a point that was not
    faithful is marked `*`, one that failed `failed`."""
    twin = bool(rows) and all(r.get("source") == TWIN for r in rows)
    lines = (["# kvtransit sweep (twin)", "",
              ("The twin's figures: the model on a virtual clock (`kvtransit twin`), every figure the model's, none "
               "measured; full size, no scale or dilation."), ""] if twin else
             ["# kvtransit sweep", "",
              ("Model terms. `*`: the run was not faithful (its report says which gap and the scale or dilation "
               "that would fix it)."), ""])
    rows = [with_j_per_request(r) for r in rows]
    for link in _ordered(r["link"] for r in rows):
        at_link = [r for r in rows if r["link"] == link]
        # The baseline (codec none) first, in each hand-off mode ("none", "none layerwise").
        codecs = sorted({r["codec_label"] for r in at_link}, key=lambda c: (c.split(" ")[0] != "none", c))
        rates = _ordered(r["rate"] for r in at_link)
        cell = {(r["rate"], r["codec_label"]): r for r in at_link}
        for metric, heading, fmt in TABLE_METRICS:
            lines += [f"## {link}: {heading}", "", "| load (req/s) | " + " | ".join(codecs) + " |",
                      "|---|" + "---|" * len(codecs)]
            for rate in rates:
                cells = []
                for codec in codecs:
                    row = cell.get((rate, codec))
                    if row is None:
                        cells.append("")
                    elif row["status"] != "ok":
                        cells.append("failed")
                    else:
                        value = row.get(metric)
                        text = "-" if value is None else fmt(value)
                        cells.append(text + ("" if row.get("faithful") or row.get("source") == TWIN else " *"))
                lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def write_tables(rows: list[dict], path: Path) -> Path:
    path = Path(path)
    path.write_text(markdown_tables(rows))
    return path


def _series(rows: list[dict], metric: str):
    """{(link, codec_label): ([rates], [values])} over the successful rows that have the metric."""
    out: dict[tuple, tuple[list, list]] = {}
    for row in sorted(_ok(rows), key=lambda r: r["rate"]):
        value = row.get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        xs, ys = out.setdefault((row["link"], row["codec_label"]), ([], []))
        xs.append(row["rate"])
        ys.append(value)
    return out


def write_plots(rows: list[dict], directory: Path) -> list[Path]:
    """The four plots (PLOT_FILES) in `directory`; one line per link × codec."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plots need matplotlib: pip install 'kvtransit[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    links = {r["link"] for r in _ok(rows)}
    specs = [
        ("slo_attainment", PLOT_FILES[0], "SLO attainment", False, None),
        ("handoff_p99_ms", PLOT_FILES[1], "hand-off p99 (ms, log)", True, None),
        ("link_busy", PLOT_FILES[2], "link busy (share of wall time)", False, None),
        ("tpot_p99_ms", PLOT_FILES[3], "TPOT p99 (ms)", False, ("TPOT SLO", TPOT_SLO_S * 1e3)),
    ]
    written = []
    for metric, filename, ylabel, log_y, slo_line in specs:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
        for (link, codec), (xs, ys) in sorted(_series(rows, metric).items()):
            ax.plot(xs, ys, marker="o", label=codec if len(links) == 1 else f"{link} {codec}")
        if slo_line is not None:
            # The threshold the rows were judged by, if they all share one; else docs/reference.md §4's.
            thresholds = {r.get("tpot_slo_ms") for r in _ok(rows)}
            shared = thresholds.pop() if len(thresholds) == 1 else None
            value: float = shared if shared is not None else slo_line[1]
            ax.axhline(value, color="crimson", linestyle="--", linewidth=1, label=f"{slo_line[0]} {value:g} ms")
        if log_y:
            ax.set_yscale("log")
        if metric == "slo_attainment":
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("load (requests/s)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel.split(' (')[0]} vs load" + (f" ({next(iter(links))})" if len(links) == 1 else ""))
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = directory / filename
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
