"""The harness's child processes: one class, `Child`, for every process a harness starts.

`kvtransit up`'s serving processes (harness/up/launcher.py) and a standalone flow's run-to-end ranks and roles
(agents/run_to_end.py: a collective's ranks, its switch, ring attention's ranks, selection's and weight streaming's
roles) are the same thing seen from here: an argv started with its stdout and stderr read from the start; its one
readiness line (agents/process.py) awaited, or its exit first, which is then a failure that quotes its last
stderr lines; a go line on stdin for a run-to-end process, then its one result line; and its end: SIGTERM then
SIGKILL for a serving process, SIGKILL for a run-to-end one (`reap`), always by its own pid.
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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvtransit.agents.process import parse_ready_line, parse_result_line

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 30.0  # a run-to-end child's default (the launcher gives its own)
STDERR_TAIL_LINES = 12  # what a process that ended without a result or readiness line is reported with
REAP_TIMEOUT_S = 5.0
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this


class ChildFailed(Exception):
    """A child did not say it was ready; the message names it and quotes its last stderr lines."""


class Child:
    """One child process: its argv, its readiness and result lines, the last lines it wrote to stderr, and where
    the root namespace reaches its ports (`host`; `kv_host`: decode's KV ingress, over the shaped link)."""

    def __init__(self, name: str, role: str, argv: Sequence[str], *, host: str = LOOPBACK, kv_host: str = LOOPBACK):
        self.name, self.role, self.argv = name, role, list(argv)
        self.host, self.kv_host = host, kv_host
        self.process: asyncio.subprocess.Process | None = None
        self.ready: dict[str, Any] | None = None  # its readiness line, once it said it
        self.result: dict[str, Any] | None = None  # a run-to-end child's result line, once it said it
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._ready = asyncio.Event()
        self._result = asyncio.Event()
        self._readers: list[asyncio.Task[None]] = []

    async def start(self, *, stdin: bool = False, env: Mapping[str, str] | None = None,
                    new_session: bool = False) -> None:
        """Start it. `stdin`: a pipe for its go line (else /dev/null); `new_session`: its own session, so a
        terminal's Ctrl-C reaches only the harness, which stops it in order."""
        self.process = process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=new_session,
            env=None if env is None else dict(env))
        assert process.stdout is not None and process.stderr is not None  # both PIPE
        loop = asyncio.get_running_loop()
        self._readers = [loop.create_task(self._read_stdout(process.stdout)),
                         loop.create_task(self._read_stderr(process.stderr))]

    async def _read_stdout(self, stdout: asyncio.StreamReader) -> None:
        try:
            while line := await stdout.readline():
                text = line.decode(errors="replace").rstrip("\n")
                if self.ready is None and (ready := parse_ready_line(text)) is not None:
                    self.ready = ready
                    self._ready.set()
                elif (result := parse_result_line(text)) is not None:
                    self.result = result
                    self._result.set()
        finally:
            self._result.set()  # the end of its stdout: no result line will come

    async def _read_stderr(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            self.stderr_tail.append(line.decode(errors="replace").rstrip())

    @property
    def started(self) -> asyncio.subprocess.Process:
        """Its process: asked only of a child that `start` started."""
        assert self.process is not None, f"{self.name} was never started"
        return self.process

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def ready_info(self) -> dict[str, Any]:
        """Its readiness line: asked only of a child whose `wait_ready` returned."""
        assert self.ready is not None, f"{self.name} has not said it is ready"
        return self.ready

    def address(self, port_key: str) -> str:
        # Decode's KV ingress and its remote-KV port are where the middlebox reaches it (over the shaped link).
        host = self.kv_host if port_key in ("listen_port", "remote_kv_port") and self.role == "decode" else self.host
        return f"{host}:{self.ready_info[port_key]}"

    async def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, *, one_line: bool = False) -> dict[str, Any]:
        """Its readiness line; ChildFailed if it exits first or says nothing within `timeout_s` (`one_line`: its
        stderr quoted on one line, as a command's error is)."""
        process = self.started
        ready = asyncio.ensure_future(self._ready.wait())
        exited = asyncio.ensure_future(process.wait())
        try:
            await asyncio.wait([ready, exited], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            exited.cancel()
        if self.ready is not None:
            return self.ready
        if process.returncode is not None:
            await self._drain()
            raise ChildFailed(f"{self.name} failed to start: {self.describe_exit(one_line=one_line)}")
        raise ChildFailed(f"{self.name} (pid {self.pid}) was not ready after {timeout_s:.0f} s")

    async def send_go(self, go: dict[str, Any]) -> None:
        """The one JSON line a run-to-end child waits for on stdin before it starts."""
        stdin = self.started.stdin
        assert stdin is not None, f"{self.name} was started without a pipe for its go line"
        stdin.write((json.dumps(go) + "\n").encode())
        await stdin.drain()

    async def wait_result(self) -> dict[str, Any] | None:
        """Its result line, or None when it ended without one (describe_exit says how)."""
        await self._result.wait()
        if self.result is None:
            await self.started.wait()
            await self._drain()
        return self.result

    def describe_exit(self, *, one_line: bool = False) -> str:
        """How it ended, with its last stderr lines (`one_line`: as a failure in a run-to-end result list)."""
        code = self.process.returncode if self.process else None
        how = ("did not start" if self.process is None else "is still running" if code is None
               else f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")
        if one_line:
            last = " | ".join(self.stderr_tail) or "no stderr output"
            return f"{self.name} {how} without a result (last stderr: {last})"
        tail = "\n".join(f"    {line}" for line in self.stderr_tail) or "    (no stderr output)"
        return f"{self.name} (pid {self.pid}) {how}; its last stderr lines:\n{tail}"

    def kill(self) -> None:
        """SIGKILL by its pid, if it still runs."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM by its pid, then SIGKILL after `grace_s`; then its output read to the end."""
        process = self.process
        if process is not None and process.returncode is None:
            try:
                os.kill(process.pid, signal.SIGTERM)
                async with asyncio.timeout(grace_s):
                    await process.wait()
            except ProcessLookupError:
                pass
            except TimeoutError:
                self.kill()
                await process.wait()
        await self._drain()

    async def _drain(self) -> None:
        """Its stdout and stderr read to their end (they end with the process)."""
        await asyncio.gather(*self._readers, return_exceptions=True)

    async def reap(self) -> None:
        """SIGKILL (a run-to-end child is past its use), wait for it, stop reading its output."""
        self.kill()
        if self.process is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(REAP_TIMEOUT_S):
                    await self.process.wait()
        for reader in self._readers:
            reader.cancel()
        await self._drain()


async def spawn(name: str, module: str, config: dict[str, Any]) -> Child:
    """A run-to-end child: `python -m module --config JSON`, a pipe for its go line."""
    return await spawn_argv(name, ["-m", module, "--config", json.dumps(config)])


async def spawn_argv(name: str, argv: list[str]) -> Child:
    child = Child(name, name, [sys.executable, *argv])
    await child.start(stdin=True)
    return child


async def ready_ports(children: Iterable[Child], timeout_s: float = READY_TIMEOUT_S,
                      port_key: str = "listen_port") -> list[int]:
    """Each run-to-end child's `port_key` from its readiness line, in order (ChildFailed, on one line, for one
    that exits first or says nothing in time)."""
    return [int((await child.wait_ready(timeout_s, one_line=True))[port_key]) for child in children]


async def collect_results(children: Sequence[Child], budget_s: float, *,
                          kill: Child | None = None, kill_at_ns: int = 0) -> list[dict[str, Any] | None]:
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
            return list(await asyncio.gather(*(child.wait_result() for child in children)))
    finally:
        if killer is not None:
            killer.cancel()
            await asyncio.gather(killer, return_exceptions=True)


def sorted_results(children: Sequence[Child],
                   results: Sequence[dict[str, Any] | None]) -> tuple[list[dict[str, Any]], list[str]]:
    """(every result that came, in order; one line for each child that ended without one or reported a failure)."""
    got, failures = [], []
    for child, result in zip(children, results, strict=True):
        if result is None:
            failures.append(child.describe_exit(one_line=True))
            continue
        got.append(result)
        if not result["ok"]:
            failures.append(f"{child.name} failed: {result['reason']}")
    return got, failures


async def run_roles(children: dict[str, Child], budget_s: float, what: str, *, kill_role: str | None = None,
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


async def reap(children: Iterable[Child]) -> None:
    """Kill every child still running (by its pid), wait for each, and stop reading its output."""
    children = list(children)
    for child in children:
        child.kill()
    for child in children:
        await child.reap()
