"""Event-loop implementations chosen by name (uvicorn's loops/auto.py style).

`auto` picks uvloop when it imports and falls back to the stdlib loop; `uvloop` and `asyncio` force one.
Agents print `running_loop_name()` at start-up so a run report says which loop carried the bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from kvtransit.model.errors import unknown_name

LOOP_CHOICES = ("auto", "uvloop", "asyncio")

T = TypeVar("T")


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError as exc:  # pragma: no cover - uvloop is a declared dependency off Windows
        raise RuntimeError("loop 'uvloop' requested but uvloop is not installed (pip install uvloop)") from exc
    return uvloop.new_event_loop


def resolve_loop(name: str = "auto") -> str:
    """The concrete loop `name` stands for: 'uvloop' or 'asyncio'."""
    if name not in LOOP_CHOICES:
        raise unknown_name("event loop", name, LOOP_CHOICES)
    if name != "auto":
        return name
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def loop_factory(name: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """A zero-argument callable making a new loop of the named kind (for asyncio.Runner)."""
    concrete = resolve_loop(name)
    return _uvloop_factory() if concrete == "uvloop" else asyncio.new_event_loop


def run(coro: Coroutine[Any, Any, T], loop: str = "auto") -> T:
    """Run `coro` to completion on a fresh loop of the named kind and return its result."""
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(coro)


def running_loop_name() -> str:
    """'uvloop' or 'asyncio': which implementation the running loop is (call from inside the loop)."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"
