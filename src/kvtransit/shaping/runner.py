"""Who runs the argv lists: a real subprocess runner, and a recorder for tests and dry runs."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Protocol

from kvtransit.shaping.errors import CommandFailed

COMMAND_TIMEOUT_S = 30.0  # one tc/ip call; far beyond the milliseconds they take, short of a hung run


class Runner(Protocol):
    def __call__(self, argv: Sequence[str]) -> str:
        """Run argv; return its stdout; raise CommandFailed (with argv and stderr) on a non-zero exit."""


def run_command(argv: Sequence[str]) -> str:
    """The real runner: no shell, captured output, loud failure."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise CommandFailed(argv, 127, f"{argv[0]}: not found on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandFailed(argv, -1, f"timed out after {COMMAND_TIMEOUT_S:g} s") from exc
    if done.returncode != 0:
        raise CommandFailed(argv, done.returncode, done.stderr)
    return done.stdout


class RecordingRunner:
    """Records every argv instead of running it. `fail_when(argv)` -> stderr text makes that command fail;
    `outputs` maps an argv (as a tuple) to the stdout it returns (e.g. `ip netns list`)."""

    def __init__(self, fail_when: Callable[[list[str]], str | None] | None = None,
                 outputs: dict[tuple[str, ...], str] | None = None) -> None:
        self.calls: list[list[str]] = []
        self._fail_when = fail_when
        self._outputs = outputs or {}

    def __call__(self, argv: Sequence[str]) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if self._fail_when is not None:
            stderr = self._fail_when(argv)
            if stderr is not None:
                raise CommandFailed(argv, 2, stderr)
        return self._outputs.get(tuple(argv), "")
