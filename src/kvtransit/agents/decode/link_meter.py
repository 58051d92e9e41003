"""What the receiving end of the hand-off link saw: bytes, and the time the link was busy delivering them.

With tc shaping the link (`link_backend` "tc"), the kernel shapes the rate and the middlebox cannot see what
crossed it, so this meter is where the link's achieved rate comes from (decode exports it as a gauge)."""

from __future__ import annotations

from kvtransit.agents.decode.incoming import Arrived


class LinkMeter:
    """Bytes delivered and the link's busy time at the receiving end.

    A request occupies the link from its KvBegin to its KvEnd; busy time is the union of those intervals,
    so idle gaps between hand-offs do not dilute the achieved rate. A streamed hand-off (layer-wise, chunked
    prefill) also leaves the link idle inside its interval, waiting for a layer's compute: those gaps (`idle`, from
    `streamed_idle_ns`) are taken out too.
    """

    def __init__(self) -> None:
        self.wire_bytes = 0
        self.raw_bytes = 0
        self._union_ns = 0
        self._idle_ns = 0
        self._open = 0
        self._busy_since = 0
        self.transfers = 0
        # Remote KV's legs (`--kv-placement remote`) that arrived while a hand-off was on the link: they shared its
        # busy time, so the link's achieved rate counts them with the hand-offs' own bytes.
        self.shared_bytes = 0

    @property
    def busy_ns(self) -> int:
        return self._union_ns - self._idle_ns

    @property
    def open_transfers(self) -> int:
        """Hand-offs begun here and neither ended nor abandoned yet."""
        return self._open

    def idle(self, gap_ns: int) -> None:
        self._idle_ns += gap_ns

    def shared(self, nbytes: int) -> None:
        """Another flow's bytes arrived now; counted when a hand-off was on the link with them."""
        if self._open:
            self.shared_bytes += nbytes

    def begin(self, t_ns: int) -> None:
        if self._open == 0:
            self._busy_since = t_ns
        self._open += 1

    def end(self, t_ns: int, wire_bytes: int, raw_bytes: int) -> None:
        self._close(t_ns)
        self.wire_bytes += wire_bytes
        self.raw_bytes += raw_bytes
        self.transfers += 1

    def abandon(self, t_ns: int) -> None:
        self._close(t_ns)

    def _close(self, t_ns: int) -> None:
        self._open -= 1
        if self._open == 0:
            self._union_ns += t_ns - self._busy_since

    @property
    def achieved_Bps(self) -> float:
        return (self.wire_bytes + self.shared_bytes) / (self.busy_ns / 1e9) if self.busy_ns else float("nan")

    def stats(self) -> dict:
        return {"wire_bytes": self.wire_bytes, "raw_bytes": self.raw_bytes, "busy_s": self.busy_ns / 1e9,
                "shared_bytes": self.shared_bytes,
                "transfers": self.transfers, "achieved_Bps": self.achieved_Bps}


def streamed_idle_ns(began_ns: int, arrived: list[Arrived], latency_ns: int) -> int:
    """How long a streamed hand-off left the link idle between its KvBegin and its last chunk, waiting for a layer's
    compute: before each chunk, the time from when the chunk before it was here (or the KvBegin) to when this one's
    first byte could be (its release + the link's latency), when that is later. 0 for chunks without release times."""
    idle, previous_ns = 0, began_ns
    for chunk in arrived:
        if chunk.release_ns:
            idle += max(0, chunk.release_ns + latency_ns - previous_ns)
        previous_ns = max(previous_ns, chunk.at_ns)
    return idle
