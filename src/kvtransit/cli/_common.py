"""What every subcommand shares: user-error types, table and JSON output."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any


class CliError(Exception):
    """A user-facing error raised by a subcommand: printed as one line, exit status 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Every exception type that means "the user gave a bad value" (printed as one line, exit 2)."""
    from kvtransit.harness.children import ChildFailed
    from kvtransit.model.errors import ConfigError

    # ChildFailed: a process a command started did not say it was ready (its exit quoted on one line).
    errors: list[type[BaseException]] = [CliError, ConfigError, ChildFailed]
    try:
        from kvtransit.kernels.errors import KernelInputError

        errors.append(KernelInputError)
    except ImportError:
        pass
    try:
        from kvtransit.shaping.errors import ShapingError

        errors.append(ShapingError)
    except ImportError:
        pass
    from kvtransit.realmodel.errors import RealModelError  # no torch: the error type alone

    errors.append(RealModelError)
    return tuple(errors)


def add_json_flag(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=_jsonable, allow_nan=False)
    sys.stdout.write("\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                caption: str | None = None) -> None:
    """A clean terminal table (rich); numbers right-aligned, as given (format them before)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption, show_lines=False, header_style="bold")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(str(c) for c in row))
    # Wide enough for the widest cell of every column (headers alone under-size long cells), so no
    # number or verdict is ever cut with an ellipsis.
    widths = [max([len(str(col))] + [len(str(row[i])) for row in rows if i < len(row)])
              for i, col in enumerate(columns)]
    Console(width=max(100, sum(widths) + 3 * len(columns) + 4, len(title))).print(table)


class LiveProgress:
    """A rich progress display that log lines can print above (subclasses add their bars to `_progress`)."""

    def __init__(self, progress) -> None:
        self._progress = progress

    def start(self) -> None:
        self._progress.start()

    def stop(self) -> None:
        self._progress.stop()

    def print(self, line: str) -> None:
        self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)


def number_or_auto(text: str) -> float | str:
    """`--dilation`, `--scale`: a number, or "auto" (the run chooses what this host can carry)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'auto'") from None


# What a command that a signal stopped exits with: 128 + SIGINT, as a shell reports an interrupted job.
SIGNALLED_EXIT = 130


def module_budget_arg(text: str) -> str | float:
    """`--module-budget`'s argparse type wherever a command takes it: a budget name (low, sim, high) or a number of
    ops per line byte > 0, as `Scenario` reads it (model/field_checks.py: module_budget)."""
    from kvtransit.model.errors import ConfigError
    from kvtransit.model.field_checks import module_budget

    try:
        return module_budget(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("module_budget: ")) from None
