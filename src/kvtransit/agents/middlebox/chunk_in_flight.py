"""What travels down the middlebox's stage chain: one KV chunk and what has happened to it so far."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtransit.wire.events import KvChunk


@dataclass
class ChunkInFlight:
    """A KV chunk on its way from the prefill side to the link.

    `arrived_ns` is when its last byte reached the middlebox (the link paces a hand-off from its first token,
    not from here, so a stage holds only what is still owed: see Middlebox._transfer). `chunk` starts as the
    frame received, with its payload copied out of the receive buffer, and each stage may replace it.
    """

    chunk: KvChunk
    arrived_ns: int
    raw_bytes: int
    codec: str = "none"  # the codec that produced the payload now in `chunk` ("none": raw)
    placement: str = "none"  # where that codec ran: "module" (in transit), "host", "gpu" (prefill), "none"
    kernel_compute_s: float = 0.0  # real host time the kernel took (measured)
    modelled_compute_s: float = 0.0  # what the module model prescribes for the same bytes
    module_ops: float = 0.0
    transit_bound: bool = False
    ready_ns: int = 0  # when the module released it to the link
    notes: dict = field(default_factory=dict)

    @property
    def wire_bytes(self) -> int:
        return len(self.chunk.payload)
