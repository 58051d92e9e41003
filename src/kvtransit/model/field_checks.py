"""A configuration field's value checked: one of named choices, a number in a range, a module budget. Each failure
is a `ConfigError` naming the field and what it accepts (the project's bad-input rule: one line, what and where).

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import MODULE_BUDGETS


def choice(field_name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(f"{field_name}: unknown value {value!r} (choose from: {', '.join(choices)})")
    return value


def module_budget(value: object) -> str | float:
    """A named budget as given, or a number of ops per byte > 0 (a numeric string becomes that number)."""
    allowed = f"{', '.join(MODULE_BUDGETS)} or a number of ops per byte > 0"
    given = value
    if isinstance(value, str):
        if value in MODULE_BUDGETS:
            return value
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"module_budget: unknown value {value!r} (choose from: {allowed})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"module_budget: expected {allowed}, got {given!r}")
    return float(value)


def number(field_name: str, value: object, *, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{field_name}: expected a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise ConfigError(f"{field_name}: expected a whole number, got {value!r}")
    bad_lo = lo is not None and (value <= lo if lo_open else value < lo)
    bad_hi = hi is not None and value > hi
    if bad_lo or bad_hi:
        low = "" if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
        high = "" if hi is None else f"<= {hi:g}"
        raise ConfigError(f"{field_name}: must be {' and '.join(x for x in (low, high) if x)}, got {value!r}")
    return int(value) if integer else value
