"""Child processes that run to an end of their own (a collective's ranks, its switch, ring attention's ranks):
started with `python -m ...`, each prints its readiness line, takes a go line on stdin and prints one result
line last (agents/process.py). The harness reads both, keeps the last lines each wrote to stderr (what a
process that dies without a result is reported with), and kills and reaps every child by its pid (`reap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from kvtransit.agents.process import parse_ready_line, parse_result_line
from kvtransit.model.errors import ConfigError

READY_TIMEOUT_S = 30.0
STDERR_TAIL_LINES = 8  # what a process that ended without a result is reported with (as the launcher does)
REAP_TIMEOUT_S = 5.0


class RunToEndChild:
    """One child: its readiness line, its result line, and the last lines it wrote to stderr."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process):
        self.name, self.proc = name, proc
        self.result: dict[str, Any] | None = None
        self.ready: dict[str, Any] | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.stderr_reader = asyncio.get_running_loop().create_task(self._read_stderr())

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr_tail.append(line.decode(errors="replace").rstrip())

    def describe_exit(self) -> str:
        """How it ended, with its last stderr lines (a result-less end is a crash or a kill)."""
        code = self.proc.returncode
        how = ("is still running" if code is None else f"was killed by signal {-code}" if code < 0
               else f"exited with status {code}")
        tail = " | ".join(self.stderr_tail) or "no stderr output"
        return f"{self.name} {how} without a result (last stderr: {tail})"

    async def read_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout_s):
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    await self.proc.wait()
                    await self.stderr_reader
                    raise ConfigError(f"{self.name} did not start: {self.describe_exit()}")
                ready = parse_ready_line(line.decode())
                if ready is not None:
                    self.ready = ready
                    return ready

    async def send_go(self, go: dict[str, Any]) -> None:
        """The one JSON line the child waits for on stdin before it starts."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(go) + "\n").encode())
        await self.proc.stdin.drain()

    async def read_result(self) -> dict[str, Any] | None:
        """Its result line, or None when it ended without one (describe_exit says how)."""
        assert self.proc.stdout is not None
        while True:
            line = (await self.proc.stdout.readline()).decode()
            if not line:
                await self.proc.wait()
                await self.stderr_reader  # the pipe is at its end once the process is gone
                return None
            result = parse_result_line(line)
            if result is not None:
                self.result = result
                return result

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)


async def spawn(name: str, module: str, config: dict[str, Any]) -> RunToEndChild:
    """`python -m module --config JSON`."""
    return await spawn_argv(name, ["-m", module, "--config", json.dumps(config)])


async def spawn_argv(name: str, argv: list[str]) -> RunToEndChild:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    return RunToEndChild(name, proc)


async def collect_results(children: Sequence[RunToEndChild], budget_s: float, *,
                          kill: RunToEndChild | None = None, kill_at_ns: int = 0) -> list[dict[str, Any] | None]:
    """Every child's result line (None for one that ended without it), in order, within `budget_s` (TimeoutError
    past it). `kill` is SIGKILLed at `kill_at_ns` on the monotonic clock (a dead-peer test)."""
    killer: asyncio.Task[None] | None = None
    if kill is not None:
        victim = kill

        async def kill_later() -> None:
            await asyncio.sleep(max(0.0, (kill_at_ns - time.monotonic_ns()) / 1e9))
            victim.kill()
        killer = asyncio.get_running_loop().create_task(kill_later())
    try:
        async with asyncio.timeout(budget_s):
            return list(await asyncio.gather(*(child.read_result() for child in children)))
    finally:
        if killer is not None:
            killer.cancel()
            await asyncio.gather(killer, return_exceptions=True)


def sorted_results(children: Sequence[RunToEndChild],
                   results: Sequence[dict[str, Any] | None]) -> tuple[list[dict[str, Any]], list[str]]:
    """(every result that came, in order; one line for each child that ended without one or reported a failure)."""
    got, failures = [], []
    for child, result in zip(children, results, strict=True):
        if result is None:
            failures.append(child.describe_exit())
            continue
        got.append(result)
        if not result["ok"]:
            failures.append(f"{child.name} failed: {result['reason']}")
    return got, failures


async def run_roles(children: dict[str, RunToEndChild], budget_s: float, what: str, *, kill_role: str | None = None,
                    kill_at_ns: int = 0) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each named child's result (its `role` field names it) and the failures, as `collect_results` and
    `sorted_results` give them; a run past `budget_s` is one failure naming `what`."""
    try:
        results = await collect_results(list(children.values()), budget_s,
                                        kill=None if kill_role is None else children[kill_role], kill_at_ns=kill_at_ns)
    except TimeoutError:
        return {}, [f"{what} did not finish within its time budget"]
    got, failures = sorted_results(list(children.values()), results)
    return {result["role"]: result for result in got}, failures


async def reap(children: Iterable[RunToEndChild]) -> None:
    """Kill every child still running (by its pid), wait for each, and stop reading its stderr."""
    children = list(children)
    for child in children:
        child.kill()
    for child in children:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(REAP_TIMEOUT_S):
                await child.proc.wait()
        child.stderr_reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await child.stderr_reader
