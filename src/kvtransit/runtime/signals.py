"""Process signals as a stop request: SIGINT/SIGTERM ask a process to drain and stop, a second one forces it;
SIGUSR1 writes every asyncio task's stack to stderr (what a process that seems stuck is waiting on).

`run_until_signalled(main)` is the one way a process runs until stopped (the agents, through
`agents/process.py: run_until_stopped`, and `kvtransit up`): `main(stop)` runs with an Event that a
signal (or a watcher, such as the agents' supervisor watch) sets, and every helper task is awaited on the way out.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TextIO, TypeVar

from kvtransit.runtime.tasks import TaskSet

T = TypeVar("T")

StopWatcher = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""Another reason to stop: a coroutine function of the stop Event that sets it when its reason comes."""


class Shutdown:
    """SIGINT/SIGTERM → `requested`; a second signal → `forced` too (stop waiting for the drain).

    Use as a context manager inside the running loop; the previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    DUMP_SIGNAL = signal.SIGUSR1

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.forced = asyncio.Event()
        self.reason = ""
        self._installed: list[signal.Signals] = []

    def request(self, reason: str = "requested") -> None:
        if self.requested.is_set():
            self.forced.set()
        else:
            self.reason = reason
            self.requested.set()

    async def wait(self) -> str:
        await self.requested.wait()
        return self.reason

    def __enter__(self) -> Shutdown:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self.request, sig.name)
            self._installed.append(sig)
        loop.add_signal_handler(self.DUMP_SIGNAL, dump_tasks)
        self._installed.append(self.DUMP_SIGNAL)
        return self

    def __exit__(self, *exc_info: object) -> None:
        loop = asyncio.get_running_loop()
        while self._installed:
            loop.remove_signal_handler(self._installed.pop())


def dump_tasks(out: TextIO | None = None) -> None:
    """Every task of the running loop with the stack it is suspended in, to `out` (default stderr): a process
    that does not finish says where (`kill -USR1 <pid>`; a thread dump shows only the loop's selector)."""
    out = out if out is not None else sys.stderr
    tasks = asyncio.all_tasks()
    out.write(f"--- {len(tasks)} asyncio task(s) of pid {os.getpid()} ---\n")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        out.write(f"task {task.get_name()!r}:\n")
        for line in _await_chain(task.get_coro()):
            out.write(f"  {line}\n")
    out.flush()


def _await_chain(coro: object) -> list[str]:
    """Where a suspended coroutine waits, outermost first: each frame down its `cr_await` chain (Task.print_stack
    shows only the outermost)."""
    lines = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        else:
            lines.append(repr(coro))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return lines


async def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[T]], *,
                              watchers: Mapping[str, StopWatcher] | None = None) -> T:
    """Run `main(stop)` and return what it returns; SIGINT/SIGTERM (or any of `watchers`, by name) set `stop`
    so `main` can drain and return. The signal relay and the watchers are stopped and awaited on the way out."""
    with Shutdown() as shutdown:
        stop = asyncio.Event()

        async def relay() -> None:
            await shutdown.wait()
            stop.set()

        helpers = TaskSet("stop request")
        helpers.spawn(relay(), "signal relay")
        for name, watch in (watchers or {}).items():
            helpers.spawn(watch(stop), name)
        try:
            return await main(stop)
        finally:
            await helpers.close()
