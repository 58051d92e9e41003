"""TaskSet: tasks held until done, a failure logged without touching siblings, one deadline to stop them all."""

from __future__ import annotations

import asyncio
import logging

from kvtransit.runtime.tasks import TaskSet


async def test_a_finished_task_leaves_the_set():
    tasks = TaskSet("test")
    task = tasks.spawn(asyncio.sleep(0), "nap")
    assert len(tasks) == 1
    await task
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert len(tasks) == 0


async def test_a_failing_task_is_logged_and_its_siblings_go_on(caplog):
    tasks = TaskSet("test")
    sibling_done = asyncio.Event()

    async def fail():
        raise RuntimeError("boom")

    async def sibling():
        await asyncio.sleep(0.01)
        sibling_done.set()

    with caplog.at_level(logging.ERROR, logger="kvtransit.runtime.tasks"):
        tasks.spawn(fail(), "fails")
        tasks.spawn(sibling(), "sibling")
        await asyncio.wait_for(sibling_done.wait(), 5)
    assert any("test: fails failed" in r.getMessage() and "boom" in r.getMessage() for r in caplog.records)


async def test_close_waits_out_the_grace_then_cancels_what_is_left():
    tasks = TaskSet("test")
    quick = tasks.spawn(asyncio.sleep(0.001), "quick")
    forever = tasks.spawn(asyncio.Event().wait(), "forever")
    cancelled = await tasks.close(grace_s=0.5, deadline_s=5)
    assert cancelled == 1
    assert quick.done() and not quick.cancelled()
    assert forever.cancelled()
    assert len(tasks) == 0


async def test_close_of_an_empty_set_returns_at_once():
    assert await TaskSet("test").close(grace_s=100, deadline_s=100) == 0
