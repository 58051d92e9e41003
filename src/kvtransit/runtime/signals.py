"""Process signals as a stop request: SIGINT/SIGTERM ask a process to drain and stop, a second one forces it.

`run_until_signalled(main)` is the one way a process runs until stopped (the agents, through
`agents/common/process.py: run_until_stopped`, and `kvtransit up`): `main(stop)` runs with an Event that a
signal (or a watcher, such as the agents' supervisor watch) sets, and every helper task is awaited on the way out.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from kvtransit.runtime.tasks import TaskSet

T = TypeVar("T")

StopWatcher = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""Another reason to stop: a coroutine function of the stop Event that sets it when its reason comes."""


class Shutdown:
    """SIGINT/SIGTERM → `requested`; a second signal → `forced` too (stop waiting for the drain).

    Use as a context manager inside the running loop; the previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

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
        return self

    def __exit__(self, *exc_info: object) -> None:
        loop = asyncio.get_running_loop()
        while self._installed:
            loop.remove_signal_handler(self._installed.pop())


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
