"""The real model in a process of its own, beside an agent (realmodel/live.py, live_worker.py).

The model takes seconds of CPU per request in torch and transformers, with the GIL held between tensor ops: run
in the agent, it would hold the event loop, and with it the step timers and the sockets. So it runs in a child
process (`python -m kvtransit.realmodel.live_worker`, niced as the caller says), and the agent talks to it over its
stdin and stdout, one request at a time, on the loop (asyncio's pipes never block it). torch is imported only there.

The child dies with the agent: `close` asks it to stop, then kills it by its pid if it has not within
STOP_GRACE_S; were the agent killed outright, the child's stdin ends and it returns (live_worker.serve).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any

from kvtransit.realmodel.errors import RealModelError
from kvtransit.realmodel.worker_wire import LENGTH_BYTES, frame, unpack

# How long a stopping worker may take to finish the request it is on before it is killed.
STOP_GRACE_S = 5.0


def worker_environment() -> dict[str, str]:
    """The worker's environment: ours, with OpenMP's idle threads sleeping instead of spinning (read once, when torch
    loads its OpenMP runtime: realmodel/session.py says what spinning cost here) unless the user chose."""
    return {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


class ModelWorker:
    """One `live_worker` process; `call` sends a request and awaits its answer."""

    def __init__(self, *, nice: int, threads: int, nice_after_load: int = 0) -> None:
        """`nice`: added before the model loads; `nice_after_load`: added once it has (a worker that loads fast and
        then computes only what the run leaves it)."""
        self.nice, self.threads, self.nice_after_load = nice, threads, nice_after_load
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvtransit.realmodel.live_worker", "--nice", str(self.nice),
            "--threads", str(self.threads), "--nice-after-load", str(self.nice_after_load),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=worker_environment())

    async def call(self, name: str, *args: Any) -> Any:
        """The worker's answer to `name(*args)` (a dataclass argument, a texts.Window, crosses as its fields); its
        failure (or its death) is a RealModelError, one line."""
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise RealModelError("the real model's worker was not started")
        async with self._lock:  # one request on the pipe at a time
            try:
                process.stdin.write(frame([name, list(args)]))
                await process.stdin.drain()
                size = int.from_bytes(await process.stdout.readexactly(LENGTH_BYTES), "big")
                status, value = unpack(await process.stdout.readexactly(size))
            except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
                code = process.returncode
                raise RealModelError(f"the real model's worker (pid {process.pid}) is gone"
                                     + (f" (exit code {code})" if code is not None else f": {exc!r}")) from None
        if status != "ok":
            raise RealModelError(value)
        return value

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        assert process.stdin is not None
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            process.stdin.close()  # end of input: the worker returns once it has answered what it is on
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
