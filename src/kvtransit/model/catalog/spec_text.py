"""`key=value,key=value` text: how a user states a model shape or a kernel declaration on one line.

Shared by the CLI (`--model-shape`, `--declare`) and by anything else that takes such specs as text (the
middlebox's control API). Every error names the spec, the bad key or value, and what was expected.
"""

from __future__ import annotations

from collections.abc import Collection

from kvtransit.model.errors import ConfigError

_TRUE = frozenset({"1", "yes", "true", "on"})
_FALSE = frozenset({"0", "no", "false", "off"})


def parse_key_values(text: str, kind: str, allowed_keys: Collection[str]) -> dict[str, str]:
    """Split `a=1,b=2` into {'a': '1', 'b': '2'}; unknown, repeated or valueless keys are errors."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError(f"{kind} {text!r}: expected key=value, got {item!r}")
        if key not in allowed_keys:
            raise ConfigError(f"{kind}: unknown key {key!r} (choose from: {', '.join(sorted(allowed_keys))})")
        if key in pairs:
            raise ConfigError(f"{kind}: key {key!r} given twice")
        pairs[key] = value
    if not pairs:
        raise ConfigError(f"{kind}: empty spec {text!r}")
    return pairs


def as_int(kind: str, key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{kind}: {key} must be an integer, got {value!r}") from None


def as_float(kind: str, key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{kind}: {key} must be a number, got {value!r}") from None


def as_bool(kind: str, key: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{kind}: {key} must be yes or no, got {value!r}")
