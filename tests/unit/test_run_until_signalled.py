"""`runtime.signals.run_until_signalled`, the one way a process runs until stopped (the agents and `kvtransit up`):
a signal or a watcher sets `stop`, `main` returns what it drained, and no helper task outlives the call."""

from __future__ import annotations

import asyncio
import os
import signal

from kvtransit.runtime.signals import run_until_signalled


def _helper_tasks() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_sigterm_sets_stop_and_main_returns_its_result_with_no_helper_task_left_running():
    async def main(stop: asyncio.Event) -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        await stop.wait()
        return "drained"

    assert await run_until_signalled(main) == "drained"
    assert _helper_tasks() == set()  # the signal relay was cancelled and awaited, not left pending
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


async def test_a_watcher_can_stop_the_run_and_is_awaited_when_main_returns_first():
    async def stops_at_once(stop: asyncio.Event) -> None:
        stop.set()

    async def never_stops(stop: asyncio.Event) -> None:
        await asyncio.Event().wait()

    async def main(stop: asyncio.Event) -> bool:
        await stop.wait()
        return stop.is_set()

    assert await run_until_signalled(main, watchers={"stops": stops_at_once, "idle": never_stops}) is True
    assert _helper_tasks() == set()
