"""The middlebox's pool path's accounting (flows/tier/middlebox_pool.py): each fetch and put event recorded once, into
the Prometheus series and the /stats totals together, as agents/middlebox/accounting.py does the hand-off's."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvtransit.agents.middlebox.accounting import OUTCOME_FAILED, OUTCOME_OK
from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.flows.tier.metrics import PoolRelayMetrics
from kvtransit.runtime.egress import TransferRecord

PHASES = ("fetch", "put")


@dataclass
class PoolTotals:
    """The pool path's totals, as /stats' "pool_relay" block shows them (payload bytes)."""

    fetches: int = 0
    fetch_raw_bytes: int = 0
    fetch_wire_bytes: int = 0
    puts: int = 0
    put_raw_bytes: int = 0
    put_wire_bytes: int = 0
    failed: int = 0
    module_energy_j: float = 0.0
    module_ops: float = 0.0


class PoolAccounting:
    """The pool path's metrics and totals (one per PoolRelay)."""

    def __init__(self, metrics: PoolRelayMetrics, *, dilation: float, model_bytes_per_byte: float):
        self.metrics = metrics
        self.dilation = dilation
        self.model_bytes_per_byte = model_bytes_per_byte
        self.totals = PoolTotals()
        for phase in PHASES:  # every series at zero from the start (see HandoffAccounting.declare)
            for stage in ("raw", "wire"):
                metrics.bytes.labels(phase=phase, stage=stage)
            for outcome in (OUTCOME_OK, OUTCOME_FAILED):
                metrics.requests.labels(phase=phase, outcome=outcome)

    def outcome(self, phase: str, ok: bool) -> None:
        """A fetch or a put ended, relayed (ok) or not."""
        self.metrics.requests.labels(phase=phase, outcome=OUTCOME_OK if ok else OUTCOME_FAILED).inc()
        if not ok:
            self.totals.failed += 1
        elif phase == "fetch":
            self.totals.fetches += 1
        else:
            self.totals.puts += 1

    def chunk(self, phase: str, item: ChunkInFlight, *, raw: int, wire: int, module_j: float) -> None:
        """A chunk of a fetch or a put crossed the pool link (`raw`, `wire`: payload bytes)."""
        m, model = self.metrics, self.model_bytes_per_byte
        m.bytes.labels(phase=phase, stage="raw").inc(raw * model)
        m.bytes.labels(phase=phase, stage="wire").inc(wire * model)
        t = self.totals
        if phase == "fetch":
            t.fetch_raw_bytes += raw
            t.fetch_wire_bytes += wire
        else:
            t.put_raw_bytes += raw
            t.put_wire_bytes += wire
        t.module_energy_j += module_j
        t.module_ops += item.module_ops

    def lane_done(self, phase: str, record: TransferRecord) -> None:
        total_s = record.queue_s + record.transfer_s
        self.metrics.transfer_seconds.labels(phase=phase).observe(total_s / self.dilation)

    def stats(self) -> dict:
        return asdict(self.totals)
