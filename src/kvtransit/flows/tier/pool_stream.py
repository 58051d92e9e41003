"""The KV pool's write-back stream, read the same way by both of its receivers (sans-IO: no sockets here).

    PoolPut(id, hash_ids)  KvBegin(id)  KvChunk(id) …  KvEnd(id)        (docs/WIRE.md; an Error(id) ends it early)

The prefill sends a write-back this way to the middlebox's pool port, and the middlebox sends it on to the
pool: `flows/tier/middlebox_pool.py` streams each put on as it arrives, `flows/tier/pool/agent.py` stores it when it
is whole. Both feed a connection's events to a `PutAssembler` and act on the steps it returns:

    PutOpened(put)          a KvBegin: the put is open (put.hash_ids empty when no PoolPut named its blocks)
    PutChunk(put, chunk)    one of its chunks (chunk.payload may be a view of the receive buffer: copy it)
    PutEnded(put)           its KvEnd: the stream is whole
    PutAborted(put, error)  an Error naming it: its source gave up
    PutWithdrawn(id, hash_ids, error)   an Error naming a put announced (PoolPut) but not yet begun: given up
                            before its KvBegin (a failed put for the pool; nothing to undo for the middlebox)

Events that are not part of a put (PoolFetch, Bye, …) give None and are the caller's to handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtransit.wire.events import Error, KvBegin, KvChunk, KvEnd, PoolPut
from kvtransit.wire.limits import MAX_OPEN_KV_STREAMS


@dataclass
class OpenPut:
    """One write-back between its KvBegin and its end."""

    begin: KvBegin
    hash_ids: tuple[int, ...]  # the blocks its PoolPut named, in order; () when none did
    chunks: list = field(default_factory=list)  # for a receiver that keeps the put whole (the pool)
    refused: str | None = None  # the receiver's reason for not taking it, if any

    @property
    def request_id(self) -> int:
        return self.begin.request_id


@dataclass(frozen=True)
class PutOpened:
    put: OpenPut


@dataclass(frozen=True)
class PutChunk:
    put: OpenPut
    chunk: KvChunk


@dataclass(frozen=True)
class PutEnded:
    put: OpenPut


@dataclass(frozen=True)
class PutAborted:
    put: OpenPut
    error: Error


@dataclass(frozen=True)
class PutWithdrawn:
    request_id: int
    hash_ids: tuple[int, ...]  # the blocks its PoolPut had named
    error: Error


PutStep = PutOpened | PutChunk | PutEnded | PutAborted | PutWithdrawn


class PutAssembler:
    """The write-backs announced and open on one connection."""

    def __init__(self) -> None:
        self._announced: dict[int, tuple[int, ...]] = {}  # request id → blocks, PoolPut seen, KvBegin not yet
        self._open: dict[int, OpenPut] = {}

    def receive(self, event: object) -> PutStep | None:
        match event:
            case PoolPut():
                # A good peer sends its KvBegin right after: more announcements than the wire lets streams be
                # open is a peer that never does, and the oldest is forgotten (bounded memory).
                if len(self._announced) >= MAX_OPEN_KV_STREAMS:
                    self._announced.pop(next(iter(self._announced)))
                self._announced[event.request_id] = event.hash_ids
                return None
            case KvBegin():
                put = OpenPut(event, self._announced.pop(event.request_id, ()))
                self._open[event.request_id] = put
                return PutOpened(put)
            case KvChunk() if event.request_id in self._open:
                return PutChunk(self._open[event.request_id], event)
            case KvEnd() if event.request_id in self._open:
                return PutEnded(self._open.pop(event.request_id))
            case Error() if event.request_id in self._open:
                return PutAborted(self._open.pop(event.request_id), event)
            case Error() if event.request_id in self._announced:
                return PutWithdrawn(event.request_id, self._announced.pop(event.request_id), event)
        return None

    def close(self) -> list[OpenPut]:
        """The connection ended: the puts still open (each incomplete), now forgotten."""
        unfinished = list(self._open.values())
        self._open.clear()
        self._announced.clear()
        return unfinished
