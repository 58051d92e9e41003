"""Dialling a peer until it answers: the two retry loops every agent needs, written once.

- `dial_within`: at start-up, a peer may start after us (compose, the launcher's order); retry at a fixed
  pace until a deadline, then give up with the caller's error.
- `redial`: a peer that went away (a restart, a link reset) is dialled again with exponential backoff for
  as long as the caller still wants it.

The waits are housekeeping, a process starting or a link coming back, not model time, so they run on the
loop's own timer: on the injected clock they would count as step wake-ups in the fidelity guard's figures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

Retryable = type[BaseException] | tuple[type[BaseException], ...]


async def dial_within(dial: Callable[[], Awaitable[T]], *, within_s: float, retry_s: float, retry_on: Retryable,
                      give_up: Callable[[BaseException], Exception]) -> T:
    """`dial()` until it succeeds; a `retry_on` failure is retried every `retry_s` until `within_s` has passed,
    then `give_up(last failure)` is raised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        try:
            return await dial()
        except retry_on as exc:
            if loop.time() >= deadline:
                raise give_up(exc) from None
        await asyncio.sleep(retry_s)


async def redial(dial: Callable[[], Awaitable[T]], *, first_s: float, max_s: float, retry_on: Retryable,
                 on_retry: Callable[[BaseException], None], wanted: Callable[[], bool] = lambda: True) -> T | None:
    """Wait `first_s`, then `dial()`; after each `retry_on` failure (`on_retry` is told) wait twice as long, up
    to `max_s`. Returns what `dial()` returned, or None once `wanted()` is false before a wait."""
    delay = first_s
    while wanted():
        await asyncio.sleep(delay)
        try:
            return await dial()
        except retry_on as exc:
            on_retry(exc)
            delay = min(max_s, delay * 2)
    return None
