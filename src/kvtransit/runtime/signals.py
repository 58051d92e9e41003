"""Process signals as a stop request: SIGINT/SIGTERM ask an agent to drain and stop, a second one forces it."""

from __future__ import annotations

import asyncio
import signal


class Shutdown:
    """SIGINT/SIGTERM → `requested`; a second signal → `forced` too (stop waiting for the drain).

    Use as a context manager inside the running loop; the previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.forced = asyncio.Event()
        self.reason = ""
        self._installed: list[signal.Signals] = []

    def request(self, reason: str = "requested") -> None:
        if self.requested.is_set():
            self.forced.set()
        else:
            self.reason = reason
            self.requested.set()

    async def wait(self) -> str:
        await self.requested.wait()
        return self.reason

    def __enter__(self) -> Shutdown:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self.request, sig.name)
            self._installed.append(sig)
        return self

    def __exit__(self, *exc_info: object) -> None:
        loop = asyncio.get_running_loop()
        while self._installed:
            loop.remove_signal_handler(self._installed.pop())
