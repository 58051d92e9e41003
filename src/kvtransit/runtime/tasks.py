"""Task lifetimes: the tasks an object starts, kept until they end, and stopped together with one deadline.

Like a trio nursery, every task has an owner that outlives it; unlike `asyncio.TaskGroup`, one task's failure
does not cancel its siblings (a connection handler or a hand-off that fails must not take its server or the
other hand-offs down): the failure is logged, and the owner learns of it from the task's own result if it
keeps the task. `close()` is the only way tasks are stopped: wait up to a grace period for them to finish on
their own, cancel what is left, then wait for the cancellations, never longer than the shutdown deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a stopping process waits for its tasks once cancelled, before it leaves them to the loop's close.
# Two seconds: a cancelled task unwinds in milliseconds (a Bye write has its own GOODBYE_TIMEOUT_S); a task
# still running after that is stuck in C code or a lost peer, and the process is exiting anyway.
SHUTDOWN_DEADLINE_S = 2.0
# How long a stopping peer waits for its Bye frame to be written: a peer that cannot take 20 bytes in a second
# is gone, and the stop must not wait on it.
GOODBYE_TIMEOUT_S = 1.0


class TaskSet:
    """The tasks one owner started (`spawn`), held strongly until done, stopped by `close()`."""

    def __init__(self, owner: str):
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}: {name}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("%s failed: %r", task.get_name(), exc, exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    async def close(self, *, grace_s: float = 0.0, deadline_s: float = SHUTDOWN_DEADLINE_S) -> int:
        """Let tasks finish for `grace_s`, cancel the rest, wait up to `deadline_s` for them.

        Returns how many were cancelled (0: all finished on their own within the grace period)."""
        if not self._tasks:
            return 0
        pending = set(self._tasks)
        if grace_s > 0:
            _, pending = await asyncio.wait(pending, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=deadline_s)
            if stuck:
                log.warning("%s: %d task(s) still running %.1f s after cancel: %s", self.owner, len(stuck),
                            deadline_s, ", ".join(sorted(t.get_name() for t in stuck)))
        return len(pending)
