"""One HTTP connection's received bytes (runtime/http.py's server reads requests through it): buffered reads that
remember when each byte came, so a request's arrival is its first byte's even when a disconnect watcher read it
early; and the watcher itself (`unless_client_leaves`), which cancels an answer's work when the client leaves.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

# One read off the socket: a 64 KiB read takes a long prompt's body in a few reads (the kernel's loopback segments).
READ_BYTES = 64 * 1024


class HeadTooLong(Exception):
    """A request line or header line longer than the head's remaining budget (the server answers 431)."""


class ClientGone(Exception):
    """The client closed the connection before its answer was complete."""


class IncomingBytes:
    """One connection's received bytes, read by the request parser and, while a watched answer is made, by the
    disconnect watcher: what the watcher reads (a pipelined next request) stays here for the parser, and each
    read remembers when it came, so a request's arrival is its first byte's even when it was read early."""

    def __init__(self, reader: asyncio.StreamReader, now_ns: Callable[[], int]):
        self._reader = reader
        self._now_ns = now_ns
        self._buffer = bytearray()
        self._consumed = 0  # bytes of the stream taken out of the buffer so far
        self._arrivals: deque[tuple[int, int]] = deque()  # (stream offset of a read's first byte, when it came)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    async def _fill(self) -> bool:
        """One read into the buffer; False at end of stream (the client closed its side)."""
        data = await self._reader.read(READ_BYTES)
        if not data:
            return False
        if not self._buffer:  # every byte read before was taken: their arrivals say nothing of these
            self._arrivals.clear()
        self._arrivals.append((self._consumed + len(self._buffer), self._now_ns()))
        self._buffer += data
        return True

    def _take(self, size: int) -> bytes:
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._consumed += size
        while len(self._arrivals) > 1 and self._arrivals[1][0] <= self._consumed:
            self._arrivals.popleft()
        return data

    def next_byte_arrived_ns(self) -> int:
        """When the next unread byte arrived (call with bytes buffered)."""
        return self._arrivals[0][1]

    async def next_request_begins(self) -> bool:
        """Wait for a request's first byte, skipping the empty lines a client may send between requests
        (RFC 9112 §2.2); False if the client closed the connection first."""
        while True:
            while self._buffer.startswith(b"\r\n"):
                self._take(2)
            if self._buffer and self._buffer != b"\r":
                return True
            if not await self._fill():
                return False

    async def read_line(self, limit: int) -> bytes:
        """The next line without its CRLF; HeadTooLong past `limit` bytes."""
        searched = 0
        while True:
            end = self._buffer.find(b"\r\n", searched)
            if end >= 0:
                return self._take(end + 2)[:-2]
            if len(self._buffer) > limit:
                raise HeadTooLong(f"a line over {limit} bytes")
            searched = max(0, len(self._buffer) - 1)
            if not await self._fill():
                raise asyncio.IncompleteReadError(bytes(self._buffer), None)

    async def read_exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not await self._fill():
                raise asyncio.IncompleteReadError(bytes(self._buffer), size)
        return self._take(size)

    async def until_closed(self, keep_at_most: int) -> None:
        """Return when the client closed its side (EOF) or reset the connection. What it sends meanwhile is kept
        for the parser, up to `keep_at_most` bytes; past that no more is read (the socket's flow control holds
        the client back) and a close is no longer seen until the answer is done."""
        try:
            while len(self._buffer) < keep_at_most:
                if not await self._fill():
                    return
        except ConnectionError:
            return
        await asyncio.Future()  # nothing more to watch for: wait to be cancelled when the answer is done


async def unless_client_leaves(incoming: IncomingBytes, work: Awaitable[Any], keep_at_most: int) -> Any:
    """`work`'s result, or ClientGone (with `work` cancelled and awaited) if the client leaves first. Bytes the
    client sends meanwhile stay in `incoming` (up to `keep_at_most`) for the next request."""
    task = asyncio.ensure_future(work)
    left = asyncio.ensure_future(incoming.until_closed(keep_at_most))
    try:
        await asyncio.wait([task, left], return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when we are cancelled ourselves (the server stopping): neither task outlives this call
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        left.cancel()
        await asyncio.gather(left, return_exceptions=True)
    if task.cancelled():
        raise ClientGone("the client closed the connection")
    return task.result()
