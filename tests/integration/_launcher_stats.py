"""Waiting on a live `Launcher` run from a test: until one of its processes' /stats says it is busy."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvtransit.harness.up.launcher import Launcher
from kvtransit.runtime.http_client import get_json


async def until_stats(launcher: Launcher, role: str, busy: Callable[[dict], object], within_s: float = 60.0) -> None:
    """Until `busy(stats)` of the first ready `role` process's /stats is true; AssertionError past `within_s`."""
    for _ in range(round(within_s / 0.1)):
        child = next((c for c in launcher.children if c.role == role and c.ready), None)
        if child is not None:
            try:
                if busy(await get_json(child.host, child.ready_info["metrics_port"], "/stats", timeout_s=2.0)):
                    return
            except (OSError, TimeoutError, ValueError):
                pass
        await asyncio.sleep(0.1)  # a test's poll, no model time
    raise AssertionError(f"the {role} was not busy within {within_s:g} s")
