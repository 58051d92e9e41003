"""The Docker CLI as `kvtransit swarm` runs it: one command, its output, or one line saying why it failed.

Blocking calls (subprocess.run): the swarm helper drives a stack from outside, step by step, and holds no event
loop; its waits are polls of what swarm reports.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from kvtransit.harness.deploy.swarm.errors import StackRunFailed, SwarmUnavailable

# One docker command answers within seconds; deploying or removing a stack of five services within a minute (the
# engine creates the overlay networks; measured about 0.1 s here).
DEFAULT_TIMEOUT_S = 60.0


class DockerFailed(StackRunFailed):
    """A docker command exited non-zero or did not answer; the message quotes its last error line."""


def docker(args: Sequence[str], *, env: Mapping[str, str] | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """`docker ARGS...`'s standard output."""
    shown = " ".join(args[:3])
    try:
        done = subprocess.run(["docker", *args], env=dict(env) if env is not None else None, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SwarmUnavailable("docker not found on PATH (install the Docker CLI)") from None
    except subprocess.TimeoutExpired:
        raise DockerFailed(f"`docker {shown}` did not answer in {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise DockerFailed(f"`docker {shown}` exited {done.returncode}: {last_line(done.stderr)}")
    return done.stdout


def last_line(text: str) -> str:
    """The last line that says something (an error's cause is its last line: a traceback's exception, the CLI's
    message)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing on stderr)"


def service_log(name: str, *, env: Mapping[str, str] | None = None, tail: int | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """A service's log lines, its tasks' stdout and stderr together (`docker service logs --raw`), oldest first;
    empty if the log cannot be read (it is evidence for a message, never the run's result)."""
    argv = ["docker", "service", "logs", "--raw", *(["--tail", str(tail)] if tail is not None else []), name]
    try:
        done = subprocess.run(argv, env=dict(env) if env is not None else None, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.splitlines() if done.returncode == 0 else []
