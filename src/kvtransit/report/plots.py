"""The run report's figures drawn as PNGs: the series come from `report_figures.py`.

matplotlib is the `plots` extra: it is imported only when a report is written (`load_matplotlib`), and without it
the report is written all the same, its Markdown saying in one line that the extra is missing. Figures are drawn
on a `Figure` with the Agg canvas, never through pyplot, so no global backend or figure registry is touched.
They go in `REPORT.figures/` beside the report (deterministic names: `FIGURE_FILES`), linked relatively.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtransit.report import figures as series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURE_FILES = {name: f"{name}.png" for name in ("ttft_cdf", "tpot_cdf", "handoff_cdf", "link_occupancy",
                                                 "timeline", "twin_departure")}
TITLES = {"ttft_cdf": "TTFT CDF", "tpot_cdf": "TPOT CDF", "handoff_cdf": "Hand-off CDF",
          "link_occupancy": "Link busy fraction and queue depth", "timeline": "Per-request timeline",
          "twin_departure": "Where the run parted from its twin"}
# The twin departure's stages, in twin/diff.py's order, and their colours (the timeline's for the same phases).
STAGE_COLOURS = {"prefill": "tab:blue", "link": "tab:orange", "decode admission": "tab:red",
                 "decode steps": "tab:green"}
PLOTS_MISSING = "Figures: not drawn, the plots extra is missing (pip install 'kvtransit[plots]' for matplotlib)."
# One size for every figure, in inches at 100 dpi: the sweep's plots' (harness/studies/sweep/report.py).
FIGSIZE, DPI = (6.4, 4.2), 100


def figures_dir(report_path: Path) -> Path:
    """`REPORT.figures/` beside `REPORT.json`."""
    return Path(report_path).with_suffix(".figures")


def load_matplotlib() -> tuple[type[Figure], Any] | None:
    """(Figure, FigureCanvasAgg), or None without the plots extra."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure, FigureCanvasAgg


def draw_report_figures(report: dict, report_path: Path) -> tuple[list[dict[str, str]], str | None]:
    """Draw every figure; returns the report's `figures` list (`name`, `file` relative to the report's folder,
    `title`, `caption`) and, when none could be drawn, the one line the Markdown says instead."""
    loaded = load_matplotlib()
    if loaded is None:
        return [], PLOTS_MISSING
    figure_cls, canvas_cls = loaded
    folder = figures_dir(report_path)
    folder.mkdir(parents=True, exist_ok=True)
    captions = series.captions(report)
    measured = report.get("config") or {}
    at = "twin, the model alone" if report.get("source") == "twin" else _short_scale(measured)
    cdfs = {c.name: c for c in series.latency_cdfs(report)}
    departures = series.departures(report.get("per_request", []))
    written = []
    for name, filename in FIGURE_FILES.items():
        if name == "twin_departure" and not departures:  # a twin's own report, or a run without one
            continue
        fig = figure_cls(figsize=FIGSIZE if name != "timeline" else (6.4, 5.2), dpi=DPI)
        canvas_cls(fig)
        if name == "link_occupancy":
            _draw_occupancy(fig, series.occupancy_of(report), at)
        elif name == "timeline":
            _draw_timeline(fig.add_subplot(), series.timeline(report.get("per_request", [])), at)
        elif name == "twin_departure":
            _draw_departures(fig.add_subplot(), departures, at)
        else:
            ax = fig.add_subplot()
            _draw_cdf(ax, cdfs[name])
            ax.set_title(f"{TITLES[name]} ({at})", fontsize=10)
        fig.tight_layout()
        fig.savefig(folder / filename)
        written.append({"name": name, "file": (folder / filename).relative_to(folder.parent).as_posix(),
                        "title": TITLES[name], "caption": captions[name]})
    return written, None


def _draw_departures(ax: Axes, rows: list[series.Departure], at: str) -> None:
    """Per request, at its arrival, live − twin in each stage stacked (positive upwards, negative downwards)."""
    xs = [r.arrival_s for r in rows]
    width = max(1e-3, (max(xs) - min(xs)) / max(1, len(xs)) * 0.8) if xs else 1.0
    up, down = [0.0] * len(rows), [0.0] * len(rows)
    for stage, colour in STAGE_COLOURS.items():
        values = [r.stage_delta_s.get(stage, 0.0) * 1e3 for r in rows]
        bottoms = [u if v >= 0 else d for v, u, d in zip(values, up, down, strict=True)]
        ax.bar(xs, values, width=width, bottom=bottoms, color=colour, label=stage)
        up = [u + max(v, 0.0) for v, u in zip(values, up, strict=True)]
        down = [d + min(v, 0.0) for v, d in zip(values, down, strict=True)]
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("arrival (s, model time)")
    ax.set_ylabel("live − twin (ms, model time)")
    ax.set_title(f"Where the run parted from its twin ({at})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def _short_scale(config: dict) -> str:
    scale, dilation = config.get("effective_scale"), config.get("effective_dilation")
    return "scale ?, dilation ?" if scale is None or dilation is None else f"scale {scale:.3g}, dilation {dilation:g}"


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} measured", ha="center", va="center", transform=ax.transAxes)


def _draw_cdf(ax: Axes, c: series.LatencyCdf) -> None:
    if c.measured.xs:
        ax.step([x * 1e3 for x in c.measured.xs], c.measured.ys, where="post", label="measured")
    else:
        _no_data(ax, c.metric)
    if c.twin is not None and c.twin.xs:
        ax.step([x * 1e3 for x in c.twin.xs], c.twin.ys, where="post", linestyle=":", color="black", label="twin")
    if c.model is not None and c.model.xs:
        ax.step([x * 1e3 for x in c.model.xs], c.model.ys, where="post", linestyle="--", color="grey",
                label="model, idle link")
    if c.line_s is not None:
        ax.axvline(c.line_s * 1e3, color="crimson", linestyle="--", linewidth=1, label=c.line_label)
    ax.set_xlabel(f"{c.metric} (ms, model time)")
    ax.set_ylabel("share of requests ≤ x")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")


def _draw_occupancy(fig: Figure, occ: series.Occupancy, at: str) -> None:
    busy_ax, depth_ax = fig.subplots(2, 1, sharex=True)
    if occ.busy:
        starts = [j * occ.bin_s for j in range(len(occ.busy))]
        busy_ax.bar(starts, occ.busy, width=occ.bin_s, align="edge", color="tab:blue")
    else:
        _no_data(busy_ax, "hand-off")
    busy_ax.set_ylim(0, 1.05)
    busy_ax.set_ylabel("busy fraction")
    busy_ax.set_title(f"Link busy and hand-offs open ({at})", fontsize=10)
    busy_ax.grid(True, alpha=0.3)
    # Stacked: on the link, then queued above it, up to the hand-offs open; the last level holds to the run's end.
    times = [*occ.times_s, occ.end_s]
    on_link, open_ = [*occ.on_link, occ.on_link[-1]], [*occ.open, occ.open[-1]]
    depth_ax.fill_between(times, 0, on_link, step="post", color="tab:blue", linewidth=0, label="on the link")
    depth_ax.fill_between(times, on_link, open_, step="post", color="crimson", linewidth=0, label="queued")
    depth_ax.set_xlabel("run time (s, model time)")
    depth_ax.set_ylabel("hand-offs")
    depth_ax.grid(True, alpha=0.3)
    depth_ax.legend(fontsize=8, loc="upper right")


# The timeline's phases: (from, to, colour, label).
PHASES = (("arrival_s", "first_token_s", "tab:blue", "prefill (queue + step)"),
          ("first_token_s", "kv_ready_s", "tab:orange", "hand-off"),
          ("kv_ready_s", "finish_s", "tab:green", "decode"))


def _draw_timeline(ax: Axes, rows: list[series.TimelineRow], at: str) -> None:
    if not rows:
        _no_data(ax, "request")
    labelled: set[str] = set()
    for y, row in enumerate(rows):
        for start_key, end_key, colour, label in PHASES:
            start, end = getattr(row, start_key), getattr(row, end_key)
            if start is None or end is None or end < start:
                continue
            ax.barh(y, end - start, left=start, height=0.6, color=colour,
                    label=None if label in labelled else label)
            labelled.add(label)
        if row.finish_s is None:  # never finished: say how it ended at its last instant
            last = max(t for t in (row.arrival_s, row.first_token_s, row.kv_ready_s) if t is not None)
            ax.plot([last], [y], marker="x", color="crimson")
            ax.annotate(row.outcome, (last, y), xytext=(4, -3), textcoords="offset points", fontsize=7)
    ax.set_yticks(range(len(rows)), [str(r.request_id) for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_ylabel("request id")
    ax.set_xlabel("run time (s, model time)")
    ax.set_title(f"First {len(rows)} requests ({at})", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # top right: the first requests sit top left, the last bottom right
        ax.legend(fontsize=8, loc="upper right")
