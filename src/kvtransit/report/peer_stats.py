"""Reading the peers' /stats JSON as the report joins it."""

from __future__ import annotations

from typing import Any


def stat_sum(stats: list[dict[str, Any]], *path: str) -> float:
    """Σ over the peers' /stats of the number at `path` (a missing key or a null counts as 0)."""
    total = 0.0
    for s in stats:
        value: Any = s  # parsed JSON: a dict on the way down, a number (or None) at the end
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        total += value or 0.0
    return total
