"""The one error family of the shaping layer: bad specs, clashing names, failed tc/ip commands."""

from __future__ import annotations

from collections.abc import Sequence


class ShapingError(ValueError):
    """Bad input to shaping: names the field and the value that was wrong (printed as one line by the CLI)."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}={value!r}: {problem}")


class CommandFailed(ShapingError):
    """A tc or ip command exited non-zero: carries the exact argv and its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        ValueError.__init__(self, f"command failed (exit {returncode}): {' '.join(self.argv)}: "
                                  f"{self.stderr or '(no stderr)'}")
        self.field = "command"
        self.value = " ".join(self.argv)
