"""One request's KV on its way through the middlebox, from its KvBegin to its outcome."""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.agents.middlebox.pipeline import KvStream
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.events import KvBegin


@dataclass
class Handoff:
    """A hand-off: what its prefill announced, where it came from, its stream of chunks, how it failed.

    `stream.kernel` is the kernel at its KvBegin: a live kernel change applies to later hand-offs."""

    begin: KvBegin
    source: Endpoint  # the prefill connection to answer
    stream: KvStream
    arrived_ns: int
    failed: str | None = None  # the reason, once it failed (it fails once)

    @property
    def request_id(self) -> int:
        return self.begin.request_id
