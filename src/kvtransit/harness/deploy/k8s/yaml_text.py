"""Plain data (dicts, lists, strings, numbers, booleans, None) as block-style YAML, for manifests people read.

kvtransit's runtime dependencies have no YAML library (PyYAML is a test extra), and the manifests need only this
subset, so it is written here: mappings and sequences in block style, keys in the order given, strings plain when
YAML 1.1 and 1.2 both read them back as the same string, multi-line strings as literal blocks (`|`) when that is
exact, and YAML's double-quoted form otherwise (ASCII, every other character escaped). Every text
this writes reads back with `yaml.safe_load` as the value it was given (tests/unit/test_k8s_yaml_text.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

INDENT = "  "
# A plain scalar that cannot be mistaken for anything else: starts with a letter, digit, `/` or `_`, holds no `: `
# (a colon is followed by a non-blank), no ` #`, quotes or flow indicators, and does not end with a colon. The words
# and number shapes YAML 1.1 resolves (yes, off, null, 0x1F, 1_000, 12:30, ...) are refused below, so a plain string
# is always read back as a string.
_PLAIN = re.compile(r"[A-Za-z0-9_/][A-Za-z0-9_./@+=:-]*(?:[ ][A-Za-z0-9_./@+=():-]+)*")
_RESERVED = frozenset({"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~", "nan", "inf"})
_NUMBER_LIKE = re.compile(r"[-+]?(\.?[0-9][0-9_]*|0[box][0-9a-f_]+)(\.[0-9_]*)?([e][-+]?[0-9]+)?|[-+]?\.(inf|nan)")
_DATE_LIKE = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*")


def dump_all(documents: Iterable[object]) -> str:
    """Documents separated by `---` lines, each ending with a newline."""
    return "".join(f"---\n{dump(document)}" for document in documents)


def dump(value: object) -> str:
    """One document: the value's block-style YAML, ending with a newline."""
    if isinstance(value, Mapping) and value:
        return "".join(_mapping_lines(value, 0))
    if _is_sequence(value) and value:
        return "".join(_sequence_lines(value, 0))  # type: ignore[arg-type]
    return _scalar(value, 0) + "\n"


def _is_sequence(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"YAML keys here are strings, got {key!r}")
    return _string(key, 0, allow_block=False)


def _mapping_lines(mapping: Mapping[object, object], depth: int) -> Iterable[str]:
    pad = INDENT * depth
    for key, value in mapping.items():
        yield from _entry(f"{pad}{_key(key)}:", value, depth)


def _sequence_lines(items: Sequence[object], depth: int) -> Iterable[str]:
    pad = INDENT * depth
    for item in items:
        if isinstance(item, Mapping) and item:
            # `- key: value` with the rest of the mapping aligned under the first key.
            lines = list(_mapping_lines(item, depth + 1))
            yield f"{pad}- {lines[0][len(pad) + len(INDENT):]}"
            yield from lines[1:]
        else:
            yield from _entry(f"{pad}-", item, depth)


def _entry(head: str, value: object, depth: int) -> Iterable[str]:
    """`head` (a `key:` or a `-`) followed by the value: inline when scalar, on the lines below when not."""
    if isinstance(value, Mapping) and value:
        yield head + "\n"
        yield from _mapping_lines(value, depth + 1)
    elif _is_sequence(value) and value:
        yield head + "\n"
        # A sequence under a key sits at the key's own indentation (the common Kubernetes style).
        yield from _sequence_lines(value, depth if head.rstrip().endswith(":") else depth + 1)  # type: ignore[arg-type]
    else:
        yield f"{head} {_scalar(value, depth + 1)}\n"


def _scalar(value: object, depth: int) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"YAML here holds finite numbers only, got {value!r}")
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if "." not in mantissa:  # YAML 1.1 reads `1e-05` as a string: it wants a dot and a signed exponent
            mantissa += ".0"
        if e and exponent[0] not in "+-":
            exponent = "+" + exponent
        return mantissa + (e + exponent if e else "")
    if isinstance(value, str):
        return _string(value, depth, allow_block=True)
    if isinstance(value, Mapping):
        return "{}"
    if _is_sequence(value):
        return "[]"
    raise TypeError(f"cannot write {type(value).__name__} as YAML: {value!r}")


def _string(text: str, depth: int, *, allow_block: bool) -> str:
    if _plain_ok(text):
        return text
    if allow_block and "\n" in text.rstrip("\n") and _block_ok(text):
        return _literal_block(text, depth)
    return _double_quoted(text)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _double_quoted(text: str) -> str:
    """YAML's double-quoted form, ASCII only: \\uXXXX for the basic plane, \\UXXXXXXXX beyond it (JSON's escapes
    would write a surrogate pair there, which YAML reads as two characters)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= code <= 0x7E:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _plain_ok(text: str) -> bool:
    lowered = text.lower()
    return (_PLAIN.fullmatch(text) is not None and ": " not in text and not text.endswith(":")
            and lowered not in _RESERVED
            and _NUMBER_LIKE.fullmatch(lowered) is None and _DATE_LIKE.fullmatch(text) is None
            and not re.fullmatch(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?", text))  # sexagesimal (1.1)


def _block_ok(text: str) -> bool:
    """A literal block keeps the text exactly when no line has trailing blanks or starts the block with a blank,
    and the text holds only printable characters, tabs and newlines."""
    lines = text.split("\n")
    printable = all(ch == "\t" or ch == "\n" or (ch.isprintable() and ch not in "\ufeff\u2028\u2029") for ch in text)
    return printable and not lines[0].startswith((" ", "\t")) and all(line == line.rstrip(" \t") for line in lines)


def _literal_block(text: str, depth: int) -> str:
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    chomp = "-" if trailing == 0 else "" if trailing == 1 else "+"
    pad = INDENT * max(depth, 1)
    lines = [pad + line if line else "" for line in body.split("\n")]
    return f"|{chomp}\n" + "\n".join(lines) + "\n" * (trailing - 1 if trailing > 1 else 0)
