"""docs/WIRE.md says what the code does: its tables are read and compared with the code's, both ways.

The frame-type table against `FrameType` and the event classes (number, name, fields), the transition table
against `ROLE_FRAMES`, the header table against the `HEADER` struct, the error codes against `ErrorCode`. A
row missing on either side, or one that disagrees, fails with the row named.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from kvtransit.wire import ROLE_FRAMES, ErrorCode, FrameType, Role, events
from kvtransit.wire._frames import EVENT_NAMES, HEADER

WIRE_MD = Path(__file__).resolve().parents[2] / "docs" / "WIRE.md"


def _section(title: str) -> list[str]:
    """The lines of the section titled `title` (a note in parentheses after it aside), up to the next heading."""
    lines = WIRE_MD.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines)
              if line.startswith("#") and re.sub(r"\s*\(.*\)$", "", line.lstrip("#").strip()) == title]
    assert len(starts) == 1, f"docs/WIRE.md has {len(starts)} sections titled {title!r}"
    body = lines[starts[0] + 1:]
    end = next((i for i, line in enumerate(body) if line.startswith("#")), len(body))
    return body[:end]


def _table(title: str, header: tuple[str, ...]) -> list[list[str]]:
    """The rows of the first Markdown table in that section, cells stripped; its header row must be `header`."""
    rows = []
    for line in _section(title):
        if not line.startswith("|"):
            if rows:
                break
            continue
        # A `\|` inside a cell is a literal bar (as in `request_id \| None`), not a cell boundary.
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(cells)
    assert rows, f"no table under {title!r} in docs/WIRE.md"
    assert tuple(rows[0]) == header, f"the table under {title!r} has columns {rows[0]}, expected {list(header)}"
    assert set("".join(rows[1])) <= set("-: "), "the second row of a Markdown table is its rule"
    return rows[2:]


def _top_level_split(text: str) -> list[str]:
    """Split on commas not inside brackets: `entries: tuple[TokenEntry(a, b)]` stays one part."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _documented_frames() -> dict[int, tuple[str, list[str]]]:
    """type number → (event name, field names) from the frame-type table."""
    frames = {}
    for type_cell, event_cell, _meta in _table("Frame types and meta", ("type", "event", "meta")):
        match = re.fullmatch(r"(\w+)\((.*)\)", event_cell)
        assert match, f"row {type_cell}: {event_cell!r} is not written as Name(field, ...)"
        name, args = match.groups()
        # Each argument is its field name, then notes: `status ok=1/failed=2`, `request_id | None`, `entries: ...`.
        fields = [re.match(r"\w+", part).group(0) for part in _top_level_split(args)]
        assert int(type_cell) not in frames, f"type {type_cell} is documented twice"
        frames[int(type_cell)] = (name, fields)
    return frames


def test_every_frame_type_in_the_code_is_documented_with_its_number_and_event():
    documented = _documented_frames()
    in_code = {int(t): EVENT_NAMES[t] for t in FrameType}
    assert {n: name for n, (name, _) in documented.items()} == in_code


def test_every_documented_frame_type_lists_its_event_fields_in_order():
    for number, (name, fields) in _documented_frames().items():
        event_cls = getattr(events, name)
        assert fields == [f.name for f in dataclasses.fields(event_cls)], f"type {number} ({name})"


def _role(text: str) -> Role:
    try:
        return Role[text.strip().upper()]
    except KeyError:
        pytest.fail(f"docs/WIRE.md names a role {text!r} the code does not have")


def _documented_hops() -> dict[tuple[Role, Role], frozenset[str]]:
    """(sender, receiver) → names of the frames it may send, from the transition table."""
    hops: dict[tuple[Role, Role], frozenset[str]] = {}
    for pairs_cell, frames_cell in _table("Transition table", ("sender → receiver", "may send")):
        frames = frozenset(name.strip() for name in frames_cell.split(","))
        # One row may name several hops that allow the same frames; a note in parentheses is not a role.
        for pair in re.sub(r"\(.*?\)", "", pairs_cell).split(","):
            sender, receiver = (_role(side) for side in pair.split("→"))
            assert (sender, receiver) not in hops, f"{pair.strip()} is documented twice"
            hops[sender, receiver] = frames
    return hops


def test_the_transition_table_lists_exactly_the_hops_the_code_allows():
    assert set(_documented_hops()) == set(ROLE_FRAMES)


@pytest.mark.parametrize("hop", sorted(ROLE_FRAMES, key=lambda pair: (pair[0].value, pair[1].value)),
                         ids=lambda pair: f"{pair[0].name.lower()}->{pair[1].name.lower()}")
def test_each_hop_documents_the_frames_the_code_lets_it_send(hop):
    documented = _documented_hops()
    assert hop in documented, f"{hop} has no row in the transition table"
    assert documented[hop] == frozenset(EVENT_NAMES[t] for t in ROLE_FRAMES[hop])


def test_the_header_table_matches_the_header_struct():
    section = "\n".join(_section("Frame"))
    assert f'struct "{HEADER.format}"' in section, "the documented struct format is not the code's"
    rows = _table("Frame", ("offset", "size", "field", "notes"))
    offset = 0
    for row_offset, size, field, _notes in rows:
        assert int(row_offset) == offset, f"{field} is documented at offset {row_offset}, follows at {offset}"
        offset += int(size)
    assert offset == HEADER.size
    assert f"header ({HEADER.size} B)" in section


def test_the_error_codes_listed_are_the_codes_in_the_code():
    text = " ".join(_section("Error codes"))
    documented = {int(n): name for n, name in re.findall(r"(\d+) ([A-Z_]{3,})", text)}
    assert documented == {code.value: code.name for code in ErrorCode}
