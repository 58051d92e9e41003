"""`kvtransit …`: one command, one file per subcommand.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets `func`. Modules
import their heavy dependencies inside the handler, so `kvtransit --help` stays fast. A flow's commands are its own
(a flow's `cli.py`, reached through the registry: kvtransit/flows/__init__.py), listed after the core's.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvtransit import flows
from kvtransit.cli._common import user_errors

# The core's subcommand modules under kvtransit.cli, in the order `--help` lists them (the flows' follow).
SUBCOMMANDS: tuple[str, ...] = (
    "calc",
    "kernels",
    "cost",
    "accuracy",
    "links",
    "up",
    "twin",
    "verdict",
    "candidates",
    "chaos",
    "sweep",
    "k8s",
    "swarm",
    "plot",
    "prefill",
    "middlebox",
    "decode",
    "loadgen",
    "frontend",
)


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags or values: one line naming the bad value (and the valid choices), exit 2, no usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="kvtransit",
        description="Emulate compute in transit on the KV-cache hand-off, with real processes and sockets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    sub.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    for _flow, module in flows.faces("cli"):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except user_errors() as exc:
        sys.stderr.write(f"kvtransit {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"kvtransit {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
