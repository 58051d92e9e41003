"""What the middlebox counts, recorded once per event: the Prometheus series and /stats' totals side by side.

Each event (a chunk in, a chunk onto the link, a hand-off's outcome, a transfer done) is one call here, which
moves the metrics (runtime/metrics.py, METRICS.md) and the typed totals /stats shows from the same figures,
so the two cannot drift apart. Units: the metrics are in model units (bytes × 1/scale, seconds ÷ dilation,
like every figure kvtransit reports); /stats keeps payload bytes and wall seconds, as it always has, and says
which in each key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.agents.middlebox.stages import LinkStage
from kvtransit.agents.middlebox.stages.kernel import RUNS_ON_HOST, RUNS_ON_MODULE
from kvtransit.runtime.egress import TransferRecord
from kvtransit.runtime.metrics import MiddleboxMetrics

OUTCOME_OK = "ok"
OUTCOME_FAILED = "failed"
# A failure reason's key in /stats' failed_reasons: its text up to the first colon ("link to decode-0 failed",
# "kernel fp8 refused request 7"), at most this many characters: a label for counting, not the message.
REASON_KEY_CHARS = 80


def reason_key(reason: str) -> str:
    return reason.split(":")[0][:REASON_KEY_CHARS]


@dataclass
class HandoffTotals:
    """The hand-off path's totals, as /stats shows them (payload bytes, wall seconds)."""

    kv_in_bytes: int = 0
    wire_bytes: int = 0
    frames_in: int = 0
    frames_out: int = 0
    handoffs_ok: int = 0
    handoffs_failed: int = 0
    kernel_compute_s: float = 0.0
    modelled_compute_s: float = 0.0  # wall seconds, like kernel_compute_s beside it
    module_energy_j: float = 0.0
    link_energy_j: float = 0.0
    module_ops: float = 0.0
    transit_bound_frames: int = 0


class HandoffAccounting:
    """The hand-off path's metrics and totals (one per Middlebox)."""

    def __init__(self, metrics: MiddleboxMetrics, *, link_name: str, dilation: float, model_bytes_per_byte: float):
        self.metrics = metrics
        self.link_name = link_name
        self.dilation = dilation
        self.model_bytes_per_byte = model_bytes_per_byte
        self.totals = HandoffTotals()
        self.failed_reasons: dict[str, int] = {}

    def model_Bps(self, shaped_Bps: float) -> float:
        """A shaped rate in model units: × dilation ÷ scale is the modelled link's rate."""
        return shaped_Bps * self.dilation * self.model_bytes_per_byte

    def declare(self, codec: str) -> None:
        """Create the labelled series at zero, so a query (and a dashboard panel) sees 0, not "no data"."""
        m, link = self.metrics, self.link_name
        for series in (m.kv_wire_bytes, m.module_ops, m.modelled_compute_seconds, m.transit_bound):
            series.labels(link=link, codec=codec)
        for stage in ("ingress", "egress"):
            m.frames.labels(link=link, stage=stage)
        for stage in ("link", "module"):
            m.module_energy_joules.labels(link=link, stage=stage)
        for outcome in (OUTCOME_OK, OUTCOME_FAILED):
            m.requests.labels(outcome=outcome)

    def watch_link(self, link: LinkStage) -> None:
        """(Re)set the link's gauges from the stage, after it was built or changed."""
        m, name, shaper = self.metrics, self.link_name, link.shaper
        m.link_configured_rate.labels(link=name).set(self.model_Bps(link.shaped_rate_Bps))
        m.link_configured_latency.labels(link=name).set(link.latency_s / self.dilation)
        m.link_busy_ratio.labels(link=name).set_function(shaper.busy_ratio)
        if link.backend == "userspace":
            # With tc, what leaves our socket is not what crossed the link: decode measures that instead.
            m.link_achieved_rate.labels(link=name).set_function(lambda: self.model_Bps(shaper.achieved_rate_Bps))

    def link_stats(self, link: LinkStage) -> dict:
        """/stats' "link" block."""
        shaper = link.shaper
        return {
            "name": self.link_name,
            "configured_Bps": self.model_Bps(link.shaped_rate_Bps),
            "shaped_configured_Bps": link.shaped_rate_Bps,
            "busy": shaper.busy_ratio(),
            "transfers": shaper.transfers_done,
            "backend": link.backend,
            # Only our own shaper's pacing is the link's rate; with tc, decode's receive side says it.
            **({"achieved_Bps": self.model_Bps(shaper.achieved_rate_Bps),
                "shaped_achieved_Bps": shaper.achieved_rate_Bps} if link.backend == "userspace" else {}),
        }

    def chunk_in(self, codec: str, raw_bytes: int) -> None:
        """A KvChunk arrived from a prefill (`codec`: what its KvBegin announced)."""
        self.metrics.kv_in_bytes.labels(link=self.link_name, codec=codec).inc(raw_bytes)
        self.metrics.frames.labels(link=self.link_name, stage="ingress").inc()
        self.totals.kv_in_bytes += raw_bytes
        self.totals.frames_in += 1

    def chunk_out(self, item: ChunkInFlight, *, link_j: float, module_j: float) -> None:
        """A chunk went onto the link; `link_j`, `module_j`: its modelled energy (docs/reference.md §5)."""
        m, link, codec = self.metrics, self.link_name, item.codec
        wire = item.wire_bytes
        m.kv_wire_bytes.labels(link=link, codec=codec).inc(wire)
        m.frames.labels(link=link, stage="egress").inc()
        m.module_energy_joules.labels(link=link, stage="link").inc(link_j)
        m.module_energy_joules.labels(link=link, stage="module").inc(module_j)
        if item.runs_on in (RUNS_ON_MODULE, RUNS_ON_HOST):
            m.kernel_compute_seconds.labels(link=link, codec=codec).observe(item.kernel_compute_s)
        if item.runs_on == RUNS_ON_MODULE:
            m.module_ops.labels(link=link, codec=codec).inc(item.module_ops)
            m.modelled_compute_seconds.labels(link=link, codec=codec).inc(item.modelled_compute_s / self.dilation)
            if item.transit_bound:
                m.transit_bound.labels(link=link, codec=codec).inc()
        t = self.totals
        t.wire_bytes += wire
        t.frames_out += 1
        t.link_energy_j += link_j
        t.module_energy_j += module_j
        t.module_ops += item.module_ops
        t.kernel_compute_s += item.kernel_compute_s
        t.modelled_compute_s += item.modelled_compute_s
        t.transit_bound_frames += int(item.transit_bound)

    def outcome(self, ok: bool, reason: str | None = None) -> None:
        """A hand-off ended: ok (decode acked) or failed, with its reason."""
        self.metrics.requests.labels(outcome=OUTCOME_OK if ok else OUTCOME_FAILED).inc()
        if ok:
            self.totals.handoffs_ok += 1
        else:
            self.totals.handoffs_failed += 1
        if reason:
            key = reason_key(reason)
            self.failed_reasons[key] = self.failed_reasons.get(key, 0) + 1

    def transfer_done(self, record: TransferRecord) -> None:
        """The egress shaper finished one hand-off (its on_transfer_done)."""
        h, link = self.metrics.handoff_seconds, self.link_name
        # Model seconds (÷ dilation), like every figure kvtransit reports.
        h.labels(link=link, phase="queue").observe(record.queue_s / self.dilation)
        h.labels(link=link, phase="transfer").observe(record.transfer_s / self.dilation)
        h.labels(link=link, phase="total").observe((record.queue_s + record.transfer_s) / self.dilation)

    def stats(self) -> dict:
        return {**asdict(self.totals), "failed_reasons": dict(self.failed_reasons)}
