"""What travels down the middlebox's stage chain: one KV chunk and what has happened to it so far."""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.wire.events import KvChunk


@dataclass
class ChunkInFlight:
    """A KV chunk on its way from its source connection to the link.

    `chunk` starts as the frame received, with its payload copied out of the receive buffer
    (pipeline.KvStream.ingest), and each stage may replace it; the other fields say what the stages did.
    """

    chunk: KvChunk
    raw_bytes: int
    codec: str = "none"  # the codec that produced the payload now in `chunk` ("none": raw)
    runs_on: str = "none"  # where that codec ran: "module" (in transit), "host", "gpu" (prefill), "none"
    kernel_compute_s: float = 0.0  # real host time the kernel took (measured)
    modelled_compute_s: float = 0.0  # what the module model prescribes for the same bytes
    module_ops: float = 0.0
    transit_bound: bool = False

    @property
    def wire_bytes(self) -> int:
        return len(self.chunk.payload)
