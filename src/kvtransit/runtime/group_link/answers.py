"""What a group's leader hears back from its followers on their control connections: a DONE for every order a
follower carried out, or an ABORT with the reason the group failed (a follower gone counts as one).

A TP group's leader (flows/tp/group/leader.py) and a ring's (flows/ring/group.py) both order their followers one
step or prompt at a time and read the answers in the background; this is that reading, once: the first failure
is kept (every later order fails with it), and at the end the leader can wait, briefly, for the answers to the
orders it sent so the counts it reports are whole.
"""

from __future__ import annotations

import asyncio
import contextlib

from kvtransit.runtime.group_link.channel import Channel, PeerGone
from kvtransit.wire.group import Kind

# Between orders the followers wait as long as their leader idles (the run's length, not a fault).
IDLE_WAIT_S = 7 * 24 * 3600.0


class FollowerAnswers:
    """The answers of followers 1..n−1 (`controls`, in rank order), read in the background from `start`."""

    def __init__(self, what: str = "rank") -> None:
        """`what`: how a follower is named in a failure's reason ("rank 2", "ring rank 2")."""
        self.what = what
        self.controls: list[Channel] = []
        self.failure: str | None = None
        self.done = 0  # DONE answers
        self.orders = 0  # orders sent to every follower
        self._answered = asyncio.Event()  # every order sent so far answered (or the group failed)
        self._readers: list[asyncio.Task[None]] = []

    def start(self, controls: list[Channel]) -> None:
        self.controls = controls
        self._readers = [asyncio.create_task(self._read(r, c), name=f"{self.what} {r} answers")
                         for r, c in enumerate(controls, start=1)]

    async def _read(self, rank: int, control: Channel) -> None:
        while True:
            try:
                frame = await control.receive(IDLE_WAIT_S, f"{self.what} {rank}'s answers")
            except PeerGone as exc:
                self.fail(f"{self.what} {rank} is gone: {exc}")
                return
            if frame.kind is Kind.DONE:
                self.done += 1
                if self.done == self.orders * len(self.controls):
                    self._answered.set()
            elif frame.kind is Kind.ABORT:
                self.fail(frame.reason)
                return

    def ordered(self) -> None:
        """One more order has gone (or is going) to every follower."""
        self.orders += 1
        self._answered.clear()

    def fail(self, reason: str) -> None:
        """The group has failed with `reason` (the first one given is kept)."""
        if self.failure is None:
            self.failure = reason
        self._answered.set()

    async def close(self, grace_s: float) -> None:
        """Wait up to `grace_s` for the answers to the orders sent (none when the group failed), then stop reading."""
        if self.orders and self.failure is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):  # a housekeeping bound, no model time
                    await self._answered.wait()
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
