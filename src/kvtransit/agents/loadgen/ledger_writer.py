"""The load generator's side of the request ledger: append-only JSONL, one record per line, flushed as written.

Record kinds and the checker are in `kvtransit.model.judge.ledger_check` (pure). `t` on kv_ready and outcome records is
the injected clock in seconds: CLOCK_MONOTONIC by default (MonotonicClock), the host's shared clock, so a chaos run
can line them up with when a fault began. Lines are written whole and flushed at once, so a load generator killed
mid-run leaves at most a torn last line, which the checker tolerates.
"""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from kvtransit.model.judge.ledger_check import OUTCOMES
from kvtransit.runtime.clock import Clock, MonotonicClock


class LedgerWriter:
    def __init__(self, path: Path, *, clock: Clock | None = None):
        self.path = Path(path)
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One run's history: a new run starts the file afresh (as it does the report), then only appends.
        # Line-buffered: every record reaches the file as one write() when its line ends.
        # The file lives as long as the writer (closed by close()), so no `with` block can hold it.
        self._file = open(self.path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115

    def write(self, **record) -> None:
        if not self._file.closed:
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def sent(self, request_id: int, output_tokens: int, prefill: int) -> None:
        self.write(ev="sent", id=request_id, output=output_tokens, prefill=prefill)

    def tokens(self, source: str, entries: list[tuple[int, int]]) -> None:
        if entries:
            self.write(ev="tokens", src=source, entries=entries)

    def kv_ready(self, request_id: int, source: str) -> None:
        self.write(ev="kv_ready", id=request_id, src=source, t=self._now_s())

    def outcome(self, request_id: int, outcome: str, reason: str | None) -> None:
        self.write(ev="outcome", id=request_id, outcome=outcome, reason=reason, t=self._now_s())

    def _now_s(self) -> float:
        return self.clock.now_ns() / 1e9

    def peer(self, stats: dict) -> None:
        self.write(ev="peer", role=stats.get("role"), name=stats.get("name"),
                   kv_content_mismatches=stats.get("kv_content_mismatches", 0),
                   handoff_retries=stats.get("handoff_retries"), handoffs_given_up=stats.get("handoffs_given_up"),
                   kv_handoffs=stats.get("kv_handoffs"))

    def counters(self, registry: CollectorRegistry) -> None:
        """The client's `kvtransit_requests_total` by outcome, read from the registry Prometheus scrapes."""
        values = {o: registry.get_sample_value("kvtransit_requests_total", {"outcome": o}) or 0 for o in OUTCOMES}
        self.write(ev="counters", requests={o: int(v) for o, v in values.items()})

    def close(self) -> None:
        self._file.close()
