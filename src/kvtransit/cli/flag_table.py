"""docs/flags.md, made from the parsers themselves: every flag of every `kvtransit` command, once.

    python -m kvtransit.cli.flag_table > docs/flags.md

One row a flag: its spelling, the older spellings it still accepts (for one release), what it means (the first
command's help, `kvtransit up`'s where it has it: the scenario flags are up's) and every command that takes it.
tests/unit/test_flag_table.py holds the committed file to what this prints, so a flag cannot be added, renamed or
given a new alias without the table saying so.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field

# Up first: its help is the scenario flags' own; then the other commands in --help order.
FIRST = "up"
NOT_LISTED = {"-h", "--help"}
SCENARIO_MARK = "--kernel-file"  # a flag only the whole scenario's commands take


@dataclass
class FlagRow:
    flag: str
    aliases: dict[str, list[str]] = field(default_factory=dict)  # an old spelling -> the commands taking it
    meaning: str = ""
    commands: list[str] = field(default_factory=list)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _meaning(help_text: str | None) -> str:
    text = " ".join((help_text or "").split())
    text = re.sub(r" ?\(default:? [^)]*\)", "", text)  # the command's own default is its --help's business
    text = re.sub(r"; also --[a-z0-9-]+(, --[a-z0-9-]+)*, the old spelling, for one release", "", text)
    return text.replace("|", "\\|").replace("%%", "%")


def flag_rows() -> list[FlagRow]:
    from kvtransit.cli import build_parser

    commands = _subparsers(build_parser())
    order = [FIRST, *(name for name in commands if name != FIRST)]
    rows: dict[str, FlagRow] = {}
    for name in order:
        for action in commands[name]._actions:
            longs = [s for s in action.option_strings if s.startswith("--") and s not in NOT_LISTED]
            if not longs:
                continue
            row = rows.setdefault(longs[0], FlagRow(longs[0]))
            for alias in longs[1:]:
                row.aliases.setdefault(alias, []).append(name)
            if not row.meaning and action.help and action.help != argparse.SUPPRESS:
                row.meaning = _meaning(action.help)
            if name not in row.commands:
                row.commands.append(name)
    return sorted(rows.values(), key=lambda r: r.flag)


def flag_table() -> str:
    rows = flag_rows()
    # The commands that take the whole scenario (cli/scenario_flags.py: add_scenario_args), named once.
    scenario = next(r.commands for r in rows if r.flag == SCENARIO_MARK)
    lines = [
        "# Every flag, once",
        "",
        "Made by `python -m kvtransit.cli.flag_table > docs/flags.md` from the commands' own parsers; a test holds",
        "this file to them. A flag means the same knob in every command that takes it: the scenario flags are",
        "`kvtransit up`'s, and the side commands (`ring`, `select`, `collective`, `weights`, ...) take them under the",
        "same names. An older spelling still accepted is listed beside its flag; it goes after one release.",
        "`kvtransit COMMAND --help` gives each command's defaults.",
        "",
        ("The scenario commands (every flag of the scenario, as `Scenario.to_argv()` writes them): "
         f"{', '.join(scenario)}."),
        "",
        f"{len(rows)} flags.",
        "",
        "| flag | old spelling (its commands) | meaning | commands |",
        "|---|---|---|---|",
    ]
    for row in rows:
        aliases = ", ".join(f"`{a}` ({', '.join(where)})" for a, where in sorted(row.aliases.items()))
        if set(scenario) <= set(row.commands):
            commands = ", ".join(["the scenario commands", *(c for c in row.commands if c not in scenario)])
        else:
            commands = ", ".join(row.commands)
        lines.append(f"| `{row.flag}` | {aliases} | {row.meaning} | {commands} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(flag_table())
