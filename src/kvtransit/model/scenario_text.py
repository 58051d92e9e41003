"""A scenario field from its text (a command-line flag's, a sweep grid's, a ConfigMap's): the inverse of
`Scenario.to_argv`, typed as the field is. Range and choice checks stay `Scenario`'s own; here a text that cannot
even be read as the field's type is a `FieldTextError` naming the field.

Pure: no I/O.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import PRECISION_BITS_RANGE
from kvtransit.model.scenario import AUTO, NONE_TEXT, field_names, scenario_fields

# Text forms of a yes/no field on a command line or in a sweep grid (to_argv writes True/False).
_TRUE_TEXT = frozenset({"yes", "true", "on", "1"})
_FALSE_TEXT = frozenset({"no", "false", "off", "0"})


class FieldTextError(ConfigError):
    """A scenario field's text that cannot be read as the field's type; `reason` is the message without the
    field's name (a flag's parser names the flag instead)."""

    def __init__(self, field_name: str, reason: str):
        super().__init__(f"{field_name}: {reason}")
        self.reason = reason


def yes_no(field_name: str, text: str) -> bool:
    """`yes`/`no` (also true/false, on/off, 1/0, any case: to_argv writes True/False)."""
    lowered = text.strip().lower()
    if lowered in _TRUE_TEXT:
        return True
    if lowered in _FALSE_TEXT:
        return False
    raise FieldTextError(field_name, f"expected yes or no, got {text!r}")


def field_from_text(field_name: str, text: str) -> Any:
    """One scenario field's value from its text (a flag's or a sweep grid's), typed as the field is: what
    `to_argv` writes reads back the same. Range and choice checks are `Scenario`'s; a value that cannot even be
    read as the field's type is a ConfigError naming the field."""
    defaults = {f.name: f.default for f in scenario_fields()}
    if field_name not in defaults:
        raise ConfigError(f"unknown scenario field {field_name!r} (choose from: {', '.join(field_names())})")
    text = text.strip()
    if field_name == "scale":
        if text == AUTO:
            return AUTO
        return _parsed(field_name, text, float, f"a number in (0, 1] or {AUTO!r}")
    if field_name == "precision_bits":
        if text.lower() == NONE_TEXT:
            return None
        lo, hi = PRECISION_BITS_RANGE
        return _parsed(field_name, text, int, f"a whole number of bits in {lo}..{hi} or {NONE_TEXT!r}")
    default = defaults[field_name]
    if isinstance(default, float) and "/" in text:  # a fraction, as the deck writes a budget: 1/16
        num, _, den = text.partition("/")
        try:
            return float(Fraction(int(num), int(den)))
        except (ValueError, ZeroDivisionError):
            raise FieldTextError(field_name, f"expected a fraction such as 1/16 or a number, got {text!r}") from None
    if isinstance(default, bool):
        return yes_no(field_name, text)
    if isinstance(default, int):
        return _parsed(field_name, text, int, "a whole number")
    if isinstance(default, float):
        return _parsed(field_name, text, float, "a number")
    return text  # names, paths, and module_budget (a name or a number: Scenario reads it)


def _parsed(field_name: str, text: str, kind: type, expected: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise FieldTextError(field_name, f"expected {expected}, got {text!r}") from None
