"""The one error type for bad user input to the model (names, sizes, declarations)."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """A value the user gave is not valid. The message names the value and the valid choices."""


def unknown_name(kind: str, value: str, choices: Iterable[str]) -> ConfigError:
    """`unknown model 'x' (choose from: a, b, c)`: the one-line form every catalogue uses."""
    return ConfigError(f"unknown {kind} {value!r} (choose from: {', '.join(sorted(choices))})")


def require_positive(name: str, value: float) -> float:
    if not value > 0:  # also rejects NaN
        raise ConfigError(f"{name} must be > 0, got {value!r}")
    return value
