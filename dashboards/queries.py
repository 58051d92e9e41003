"""Read the generated dashboards back: every panel's PromQL, and the metric names each query reads.

Stdlib only, so the tests that check the committed JSON (metric names against METRICS.md, every query against
a real Prometheus) run without the `dashboards` extra.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

JSON_DIR = Path(__file__).resolve().parent / "json"

# PromQL words that look like names but are not metrics (operators and modifiers; functions are followed by
# "(" and dropped by the pattern below).
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
             "offset", "inf", "nan"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAMES = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref}: {self.expr}"


def dashboard_files() -> list[Path]:
    return sorted(JSON_DIR.glob("*.json"))


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # a collapsed row holds its panels


def panel_queries(path: Path) -> list[PanelQuery]:
    """Every Prometheus query of every panel of one dashboard JSON file."""
    board = json.loads(path.read_text())
    found = []
    for panel in _panels(board.get("panels") or []):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                found.append(PanelQuery(board["title"], panel.get("title", "?"), target.get("refId", "?"),
                                        target["expr"]))
    return found


def all_queries() -> list[PanelQuery]:
    return [query for path in dashboard_files() for query in panel_queries(path)]


def metric_names(expr: str) -> set[str]:
    """The metric (and recording rule) names a PromQL expression reads."""
    text = _STRINGS.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    return {name for name in _NAMES.findall(text) if name.lower() not in _KEYWORDS}
