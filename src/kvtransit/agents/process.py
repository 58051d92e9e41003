"""What every agent process shares: addresses, the readiness line, the HTTP side (/metrics, /stats), signals.

The readiness line is how a launcher learns an agent's ports without races: the agent binds every socket
first (port 0 = the kernel picks a free one), then prints exactly one line

    KVTRANSIT-READY {"role": "decode", "name": "decode-0", "pid": 123, "listen_port": 40123, ...}

to stdout and flushes. Nothing else an agent prints starts with that prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import lateness_mean, lateness_p99, step_share
from kvtransit.report.finite import finite_json
from kvtransit.runtime import metrics as runtime_metrics
from kvtransit.runtime import wakeup_priority
from kvtransit.runtime.clock import Clock, MonotonicClock
from kvtransit.runtime.http import HttpServer
from kvtransit.runtime.signals import StopWatcher, run_until_signalled
from kvtransit.runtime.transport import Server, serve
from kvtransit.wire.events import Role

T = TypeVar("T")
READY_PREFIX = "KVTRANSIT-READY "
# A process that runs to an end of its own (a collective's rank, the switch) prints one result line last.
RESULT_PREFIX = "KVTRANSIT-RESULT "
DEFAULT_METRICS_LISTEN = "127.0.0.1:0"


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_address(text: str, flag: str) -> Address:
    """`HOST:PORT` (port 0: any free port). A bad one is a one-line error naming the flag."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{flag}: expected HOST:PORT, got {text!r}")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{flag}: port must be a number, got {port!r} in {text!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{flag}: port must be in 0..65535, got {number}")
    return Address(host.strip("[]"), number)


def parse_addresses(text: str, flag: str) -> list[Address]:
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"{flag}: expected HOST:PORT[,HOST:PORT...], got {text!r}")
    return [parse_address(item.strip(), flag) for item in items]


def port_in_use_error(address: Address, flag: str, exc: OSError) -> ConfigError:
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"port {address} is already in use (move it with {flag} HOST:PORT, port 0 picks a free one)")
    return ConfigError(f"cannot listen on {address} ({flag}): {exc.strerror or exc}")


async def listen(address: Address, flag: str, handler, our_role: Role, their_role: Role) -> Server:
    """A wire server on `address`; a port in use is a one-line error naming the port and the flag."""
    try:
        return await serve(address.host, address.port, handler, our_role, their_role)
    except OSError as exc:
        raise port_in_use_error(address, flag, exc) from None


StatsHandler = Callable[[], dict | Awaitable[dict]]  # an agent whose parts settle first answers after they do


async def start_http(address: Address, registry: CollectorRegistry, stats: StatsHandler,
                     flag: str = "--metrics-listen") -> HttpServer:
    """`/metrics` (Prometheus) and `/stats` (this process's JSON summary for the run report)."""
    http = HttpServer(registry=registry)

    async def stats_route(_request) -> Any:
        summary = stats()
        return finite_json(await summary if inspect.isawaitable(summary) else summary)

    http.route("GET", "/stats", stats_route, public=True)
    try:
        await http.start(address.host, address.port)
    except OSError as exc:
        raise port_in_use_error(address, flag, exc) from None
    return http


def announce_ready(role: str, name: str, **fields: int | str) -> None:
    """Print the one readiness line (see the module docstring) and flush. `fields`: the ports, and any
    setting the launcher must learn from the agent itself (the middlebox's link_backend)."""
    info = {"role": role, "name": name, "pid": os.getpid(), **fields}
    sys.stdout.write(READY_PREFIX + json.dumps(info) + "\n")
    sys.stdout.flush()


def parse_ready_line(line: str) -> dict | None:
    """The JSON of a readiness line, or None for any other line."""
    if not line.startswith(READY_PREFIX):
        return None
    return json.loads(line[len(READY_PREFIX):])


def announce_result(data: dict[str, Any]) -> None:
    """Print the one result line of a process that runs to its own end, and flush."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(data) + "\n")
    sys.stdout.flush()


async def read_go_line() -> dict[str, Any]:
    """The one JSON line a run-to-end process waits for on stdin (its peers, the start time) before it starts."""
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if not line:
        raise EOFError("the launcher closed stdin before the go line")
    return dict(json.loads(line))


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None if `stop` is set first. Either way nothing is left running: `work` is cancelled
    and awaited if it has not ended (also when this is cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


def parse_result_line(line: str) -> dict | None:
    """The JSON of a result line, or None for any other line."""
    if not line.startswith(RESULT_PREFIX):
        return None
    return json.loads(line[len(RESULT_PREFIX):])


def new_registry(role: str) -> tuple[CollectorRegistry, runtime_metrics.SharedMetrics]:
    registry = CollectorRegistry()
    return registry, runtime_metrics.shared_metrics(registry)


def export_timer_share(shared: runtime_metrics.SharedMetrics, role: str, samples: list[float],
                       shortest_step_wall_s: Callable[[], float | None]) -> None:
    """The fidelity guard's timer gap as a gauge, so the "not faithful" alert counts timer lateness too: mean
    lateness over the shortest step held (0 until a step was held and a wake-up timed)."""
    def share() -> float:
        mean, step = lateness_mean(samples), shortest_step_wall_s()
        return 0.0 if mean is None or not step else step_share(mean, step)

    shared.timer_lateness_step_share.labels(role=role).set_function(share)


def lateness_observer(shared: runtime_metrics.SharedMetrics, role: str, samples: list[float]):
    """Feeds the clock's wake-up lateness to the histogram and to the fidelity guard's sample list."""
    child = shared.timer_lateness_seconds.labels(role=role)

    def observe(seconds: float) -> None:
        child.observe(seconds)
        if len(samples) < 200_000:  # bounded: a long run keeps its first 200k wake-ups
            samples.append(seconds)

    return observe


def step_clock(shared: runtime_metrics.SharedMetrics, role: str, clock: Clock | None,
               shortest_step_wall_s: Callable[[], float | None]) -> tuple[Clock, list[float]]:
    """The clock a stepping agent (prefill, decode) holds its steps on, and its wake-up lateness samples: `clock`
    as injected (a ManualClock in tests), else the monotonic clock, its lateness fed to the histogram and to the
    fidelity guard, its wake-ups at real-time priority where the host allows (runtime/wakeup_priority.py); the
    guard's timer share exported either way. Call it on the thread that runs the loop."""
    lateness: list[float] = []
    if clock is None:
        clock = MonotonicClock(observe_lateness=lateness_observer(shared, role, lateness),
                               wakeup_priority=wakeup_priority.probe())
    export_timer_share(shared, role, lateness, shortest_step_wall_s)
    return clock, lateness


def timer_stats(clock: Clock, lateness: list[float]) -> dict[str, Any]:
    """A stepping agent's clock in its /stats: its wake-ups' lateness (the fidelity guard's timer check), how many,
    what its holds wait on ("timerfd": sub-ms, sleeping; "loop": the ms timer and a 1 ms spin; "manual"), and at
    what priority its wake-ups run."""
    return {"timer_lateness_p99_s": lateness_p99(lateness), "timer_lateness_mean_s": lateness_mean(lateness),
            "timer_wakeups": len(lateness), "timer": clock.timer, "timer_priority": timer_priority(clock)}


def timer_priority(clock: Clock) -> str:
    """What a clock's wake-ups run at, for an agent's stats: "realtime (...)", "normal: <why>", or "manual"."""
    if clock.timer == "manual":
        return "manual"
    priority = getattr(clock, "wakeup_priority", None)
    return priority.describe() if priority is not None else "normal"


# Set by the launcher in its children's environment: stop when the launcher is gone (its pid no longer our
# parent), so a launcher killed outright (SIGKILL, OOM) leaves no orphans behind. Children run in their own
# sessions (for an orderly Ctrl-C), so the terminal would not reach them.
SUPERVISED_ENV = "KVTRANSIT_SUPERVISOR_PID"
PARENT_POLL_S = 1.0


async def _watch_parent(stop: asyncio.Event, supervisor_pid: int) -> None:
    while not stop.is_set():
        if os.getppid() != supervisor_pid:
            stop.set()
            with contextlib.suppress(OSError):  # the supervisor read our stderr: the pipe is likely broken now
                sys.stderr.write(f"supervisor (pid {supervisor_pid}) is gone: stopping\n")
            return
        # A housekeeping poll, so the loop's own timer: it is no model time and must not count as a clock wake-up.
        await asyncio.sleep(PARENT_POLL_S)


async def run_until_stopped(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `main(stop)`; SIGINT/SIGTERM (or the supervisor's death) set `stop` so it can drain and return."""
    watchers: dict[str, StopWatcher] = {}
    supervisor = os.environ.get(SUPERVISED_ENV, "")
    if supervisor.isdigit():
        supervisor_pid = int(supervisor)
        watchers["supervisor watch"] = lambda stop: _watch_parent(stop, supervisor_pid)
    await run_until_signalled(main, watchers=watchers)
