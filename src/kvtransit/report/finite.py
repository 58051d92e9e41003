"""JSON has no NaN or infinity: a figure that could not be measured goes out as null, in a report and on /stats."""

from __future__ import annotations

import math
from typing import Any


def finite_json(value: Any) -> Any:
    """`value` with every non-finite float, at any depth of dicts, lists and tuples, replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
