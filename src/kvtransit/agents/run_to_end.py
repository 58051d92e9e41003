"""The one lifecycle of a process that runs to an end of its own: a standalone flow's ranks and roles (a TP rank,
a ring rank, selection's pool, module and decode, weight streaming's store and instance).

`python -m <module> --config JSON` (`run_config_process`), then, over its standard streams, with the harness that
started it (harness/children.py: `Child`):
1. it binds what it serves (port 0: the kernel picks) and prints the readiness line (agents/process.py);
2. it reads one JSON go line on stdin: where its peers listen and the group's first step on the host's monotonic
   clock, which every process here shares;
3. it joins its peers and plays its part (`play(go)`), and prints one `KVTRANSIT-RESULT {json}` line last;
4. it exits 0 whether or not its part failed: a peer gone, the harness's stdin closed before the go line or a
   signal is a result with its reason (`failed(reason)`), not an exit status.

What is closed (its channels, its listener) is closed whatever happened, before the result line. A flow's process
says only what is its own: its ports, its part, its failed result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from kvtransit.agents.process import announce_ready, announce_result, read_go_line, run_until_stopped, unless_stopped
from kvtransit.runtime.group_link.channel import PeerGone


class Outcome(Protocol):
    """A part's result: what its result line carries."""

    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Outcome)


async def run_to_end(stop: asyncio.Event, *, role: str, name: str, who: str, ports: Mapping[str, int],
                     play: Callable[[dict[str, Any]], Awaitable[R]], failed: Callable[[str], R],
                     close: Callable[[], Awaitable[None]], labels: Mapping[str, Any] | None = None) -> None:
    """Steps 1–3 of the module docstring: the readiness line (`role`, `name`, `ports`), the go line, `play(go)`
    until it returns or `stop` is set, `close()`, the result line (`labels` first, then the outcome's fields).
    `who` names the process in a failure's reason ("rank 2", "the pool")."""
    announce_ready(role, name, **ports)
    result: R
    try:
        go = await read_go_line()
        done = await unless_stopped(play(go), stop)
        result = done if done is not None else failed(f"{who} was stopped")
    except (PeerGone, EOFError) as exc:
        result = failed(f"{who}: {exc}")
    finally:
        await close()
    announce_result({**(labels or {}), **result.to_json()})


def run_config_process(prog: str, config_help: str,
                       main: Callable[[dict[str, Any], asyncio.Event], Awaitable[None]], argv: list[str] | None) -> int:
    """The entry point: `prog --config JSON`, then `main(config, stop)` until it returns or a signal stops it
    (agents/process.py: run_until_stopped). Exit 0: a failure is a result line, not an exit status."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", required=True, help=config_help)
    config = json.loads(parser.parse_args(argv).config)
    asyncio.run(run_until_stopped(lambda stop: main(config, stop)))
    return 0
