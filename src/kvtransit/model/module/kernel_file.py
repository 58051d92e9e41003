"""A kernel declaration in a file: TOML or JSON by suffix, one kernel per file (docs/reference.md §5, the deck's
sketch).

The fields are `KernelDeclaration`'s, by name, as in the deck's sketch (`op_types` a list):

    name = "freq-keep-half"
    ratio = 2.0
    ops_per_byte = 0.0
    op_types = ["fft", "gather"]
    transform = "fft"
    transform_length = 64
    transform_charged = false
    precision_bits = 8
    placement = "pluggable"

Every error is one line naming the file, the field and what it accepts; an unknown field is refused by name
(a misspelt field must not silently fall back to its default). Reading the file is this module's only I/O
(as `ledger_check.py` reads a ledger); `declaration_from_mapping` is the pure part.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import KNOWN_OPS, PLACEMENTS, TRANSFORMS, KernelDeclaration

SUFFIXES = (".json", ".toml")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_op_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(op, str) for op in value)


# field -> (test of the value's type, what it accepts, for the error)
_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "name": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "ratio": (_is_number, "a number > 0 (input bytes / output bytes)"),
    "ops_per_byte": (_is_number, "a number >= 0 (operations per input byte besides the transform)"),
    "op_types": (_is_op_list, f"a list of op names from: {', '.join(sorted(KNOWN_OPS))}"),
    "transform": (lambda v: isinstance(v, str), f"one of: {', '.join(TRANSFORMS)}"),
    "transform_length": (_is_int, "an integer N >= 2 (a power of two for fft and ntt)"),
    "transform_charged": (lambda v: isinstance(v, bool), "true or false"),
    "precision_bits": (_is_int, "an integer in 1..32"),
    "placement": (lambda v: isinstance(v, str), f"one of: {', '.join(PLACEMENTS)}"),
    "lossless": (lambda v: isinstance(v, bool), "true or false"),
    "streams": (_is_int, "an integer >= 1 (2 or more for a kernel that combines streams)"),
}
FIELDS = tuple(_FIELDS)


def declaration_from_mapping(data: Mapping[str, Any], where: str) -> KernelDeclaration:
    """The declaration `data` states; `where` (the file) starts every error."""
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (choose from: {', '.join(FIELDS)})")
    if "name" not in data:
        raise ConfigError(f"{where}: name: missing (a kernel declaration needs a name)")
    for key, value in data.items():
        valid, accepts = _FIELDS[key]
        if not valid(value):
            raise ConfigError(f"{where}: {key}: expected {accepts}, got {value!r}")
    kwargs = dict(data)
    if "op_types" in kwargs:
        kwargs["op_types"] = frozenset(kwargs["op_types"])
    try:
        return KernelDeclaration(**kwargs)
    except ConfigError as exc:  # the declaration's own checks name the field and the allowed values
        raise ConfigError(f"{where}: {exc}") from None


def declaration_to_mapping(decl: KernelDeclaration) -> dict[str, Any]:
    """The fields of `decl` as a file states them (op_types sorted; unset optional fields left out)."""
    out: dict[str, Any] = {
        "name": decl.name, "ratio": decl.ratio, "ops_per_byte": decl.ops_per_byte,
        "op_types": sorted(decl.op_types), "transform": decl.transform,
        "transform_length": decl.transform_length, "transform_charged": decl.transform_charged,
        "precision_bits": decl.precision_bits, "placement": decl.placement, "lossless": decl.lossless,
        "streams": decl.streams,
    }
    return {key: value for key, value in out.items() if value is not None}


def is_kernel_file_name(text: str) -> bool:
    """Whether `text` names a kernel file (an existing file, or a .toml/.json name) rather than inline text."""
    return text.lower().endswith(SUFFIXES) or os.path.isfile(text)


def _parse(text: str, suffix: str, where: str) -> object:
    if suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc}") from None


def load_kernel_declaration(path: str | os.PathLike[str]) -> KernelDeclaration:
    """The kernel declared in the file at `path` (.toml or .json)."""
    where = str(path)
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(
            f"{where}: unknown kernel file type {suffix or '(none)'!r} (choose from: {', '.join(SUFFIXES)})")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{where}: cannot read the kernel file: {reason}") from None
    data = _parse(text, suffix, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected one kernel's fields as a table/object, got {type(data).__name__}")
    return declaration_from_mapping(data, where)
