"""tc-style quantity strings ("200mbit", "5ms", "64kb") to base units (bytes/s, seconds, bytes).

Suffixes follow tc(8) "PARAMETERS": rates in bit or byte per second with SI (k, m, g, t) or IEC (ki, mi,
gi, ti) prefixes, where "bps" means BYTES per second; times in s, ms, us; sizes in b, kb, mb, gb (tc's "kb" is
1024 bytes, so ours is too).
"""

from __future__ import annotations

import re

from kvtransit.shaping.errors import ShapingError

_NUMBER = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_IEC = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}

# tc(8): "bit" = bits per second, "bps" = bytes per second.
_RATE_UNITS: dict[str, float] = {}
for _p, _m in {**_SI, **_IEC}.items():
    _RATE_UNITS[f"{_p}bit"] = _m / 8.0
    _RATE_UNITS[f"{_p}bps"] = _m
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
# tc(8): "kb" / "k" = kibibytes, "mb" / "m" = mebibytes, "b" = bytes.
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def _split(field: str, text: str) -> tuple[float, str]:
    match = _NUMBER.match(text) if isinstance(text, str) else None
    if not match:
        raise ShapingError(field, text, "expected a number with a unit, e.g. '200mbit', '5ms', '64kb'")
    if float(match.group(1)) < 0:
        raise ShapingError(field, text, "must not be negative")
    return float(match.group(1)), match.group(2).lower()


def parse_rate(text: str, field: str = "rate") -> float:
    """'200mbit' -> 25_000_000.0 bytes/s. A bare number is rejected: bit or byte is too easy to confuse."""
    value, unit = _split(field, text)
    if unit not in _RATE_UNITS:
        raise ShapingError(field, text, f"unknown rate unit {unit!r}; use bit/kbit/mbit/gbit or bps/kbps/mbps/gbps")
    return value * _RATE_UNITS[unit]


def parse_time(text: str, field: str = "latency") -> float:
    """'5ms' -> 0.005 seconds."""
    value, unit = _split(field, text)
    if unit not in _TIME_UNITS:
        raise ShapingError(field, text, f"unknown time unit {unit!r}; use s, ms or us")
    return value * _TIME_UNITS[unit]


def parse_size(text: str, field: str = "limit") -> int:
    """'64kb' -> 65536 bytes."""
    value, unit = _split(field, text)
    if unit not in _SIZE_UNITS:
        raise ShapingError(field, text, f"unknown size unit {unit!r}; use b, kb, mb or gb")
    return round(value * _SIZE_UNITS[unit])


def format_rate_bits(rate_Bps: float) -> str:
    """A rate as tc wants it: whole bits per second ("200000000bit"), exact and unambiguous."""
    return f"{round(rate_Bps * 8)}bit"


def format_time_us(seconds: float) -> str:
    """A duration as tc wants it, in whole microseconds ("5000us")."""
    return f"{round(seconds * 1e6)}us"
