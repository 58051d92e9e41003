"""What the load tests share: wire peers on plain asyncio streams, the process's RSS, latency percentiles.

The peers speak the sans-IO `wire.Connection` over `asyncio` streams directly, not through `runtime`, so the
load tests measure the middlebox and the agents, not a test double built on the code under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvtransit.wire import NEED_DATA, Connection, Role

READ_BYTES = 1 << 18


def rss_bytes(pid: int) -> int:
    """Resident set size of a live process, from /proc (Linux): what the kernel holds for it right now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for pid {pid}")


@dataclass
class RssSampler:
    """The RSS of some processes every `interval_s` until stopped: (monotonic time, bytes) samples by name.

    `processes()` says which to sample now ({name: pid}), so processes started later are picked up."""

    processes: Callable[[], dict[str, int]]
    interval_s: float = 0.25
    samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for name, pid in self.processes().items():
                # A process that exited (or is exiting) has no RSS to read: its last samples stand.
                with contextlib.suppress(OSError, LookupError):
                    self.samples.setdefault(name, []).append((time.monotonic(), rss_bytes(pid)))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await stop.wait()

    def growth_after(self, name: str, warm_at: float) -> tuple[int, int]:
        """(RSS at the first sample from `warm_at` on, the largest RSS from then on) of one process."""
        after = [rss for t, rss in self.samples[name] if t >= warm_at]
        assert after, f"no RSS sample of {name} after the warm-up"
        return after[0], max(after)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class Peer:
    """One end of one hop over an asyncio stream: send events, read events, nothing else."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, our: Role, their: Role):
        self.reader, self.writer = reader, writer
        self.connection = Connection(our, their)

    @classmethod
    async def dial(cls, port: int, our: Role, their: Role) -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, our, their)

    async def send(self, event) -> None:
        for part in self.connection.send_parts(event):
            self.writer.write(part)
        await self.writer.drain()

    async def next_event(self):
        while True:
            event = self.connection.next_event()
            if event is not NEED_DATA:
                return event
            self.connection.receive_data(await self.reader.read(READ_BYTES))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

