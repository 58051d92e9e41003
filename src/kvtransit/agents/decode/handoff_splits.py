"""Every taken hand-off split at its first token (model/serving/layerwise.py: `HandoffSplit`), and the
streamed ones held against the model's exposed time.

The exposed part is KV ready − first token; the hidden part runs from the first KV bytes here to the first token,
with the bytes that arrived by then. Sums go to `/stats` (`handoff_split`), each request's beside its queue wait.
A streamed hand-off (layer-wise, chunked prefill: its chunks carry their release times) that found the link free
is also held against the model's exposed time (`model.fidelity.prescribed_exposed_s`), here where its release times
and bytes are known: the report's hand-off check in those modes (`streamed_handoff_model` in /stats)."""

from __future__ import annotations

from collections import deque

from kvtransit.agents.decode.incoming import Incoming
from kvtransit.model.judge.fidelity import handoff_distribution, handoff_gap, prescribed_exposed_s
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.layerwise import HandoffSplit, link_was_free

# How many of the latest streamed hand-offs are kept to tell whether the next found the link free: more than the
# link's lanes can hold at once (docs/reference.md §4: 1 by default), however many there are.
RECENT_TRANSFERS_PER_CHANNEL = 8


class HandoffSplits:
    """The split of each taken hand-off (model seconds, bytes at scale): sums, and each request's.

    `metrics`: decode's metric set (runtime/metrics.py: handoff_exposed_seconds, handoff_hidden_seconds,
    handoff_bytes)."""

    def __init__(self, scenario: Scenario, metrics) -> None:
        self.scenario = scenario
        self._metrics = metrics
        self.totals = {"exposed_s": 0.0, "hidden_s": 0.0, "hidden_bytes": 0, "bytes": 0, "handoffs": 0}
        self.by_request: dict[int, HandoffSplit] = {}
        # Streamed hand-offs against the model's exposed time: (measured, prescribed) model seconds of each that
        # found the link free, how many were measured, and the latest ones' (first release, KV ready) stamps.
        self.streamed_pairs: list[tuple[float, float]] = []
        self.streamed_handoffs = 0
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_TRANSFERS_PER_CHANNEL * scenario.channels)

    def record(self, item: Incoming, ready_ns: int) -> None:
        """A taken hand-off, its KV ready at `ready_ns` (wall ns on decode's clock)."""
        first_token_ns = item.first_token_ns
        if not first_token_ns or not item.arrived:
            return  # no first token known (a sender that stamps none) or no bytes: nothing to split
        per_ns = 1e-9 / self.scenario.effective_dilation  # wall ns → model seconds
        split = HandoffSplit.from_stamps(
            first_token_ns=first_token_ns, first_bytes_ns=item.arrived[0].at_ns, ready_ns=ready_ns,
            hidden_bytes=sum(a.wire_bytes for a in item.arrived if a.at_ns <= first_token_ns),
            total_bytes=item.wire_bytes, seconds_per_ns=per_ns)
        self.by_request[item.begin.request_id] = split
        metrics = self._metrics
        metrics.handoff_exposed_seconds.observe(split.exposed_s)
        metrics.handoff_hidden_seconds.observe(split.hidden_s)
        metrics.handoff_bytes.labels(phase="hidden").inc(split.hidden_bytes)
        metrics.handoff_bytes.labels(phase="exposed").inc(split.bytes - split.hidden_bytes)
        totals = self.totals
        totals["exposed_s"] += split.exposed_s
        totals["hidden_s"] += split.hidden_s
        totals["hidden_bytes"] += split.hidden_bytes
        totals["bytes"] += split.bytes
        totals["handoffs"] += 1
        if item.streamed:
            self._against_the_model(item, first_token_ns, ready_ns, split.exposed_s)

    def _against_the_model(self, item: Incoming, first_token_ns: int, ready_ns: int, exposed_s: float) -> None:
        scenario = self.scenario
        first_release_ns = min(a.release_ns or first_token_ns for a in item.arrived)
        free = link_was_free(first_release_ns, self._recent, scenario.channels)
        self._recent.append((first_release_ns, ready_ns))
        self.streamed_handoffs += 1
        if not free:
            return
        per_ns, scale = 1e-9 / scenario.effective_dilation, scenario.effective_scale
        chunks = [(((a.release_ns or first_token_ns) - first_token_ns) * per_ns, a.raw_bytes / scale,
                   a.wire_bytes / scale) for a in item.arrived]
        self.streamed_pairs.append((exposed_s, prescribed_exposed_s(scenario, chunks, item.begin.n_layers)))

    def streamed_model_stats(self) -> dict | None:
        """The streamed hand-offs that found the link free, exposed time against the model (model/judge/fidelity.py's
        hand-off rule on them); None when none was streamed."""
        if not self.streamed_handoffs:
            return None
        measured = [m for m, _ in self.streamed_pairs]
        prescribed = [p for _, p in self.streamed_pairs]
        return {"check": handoff_gap(measured, prescribed, self.scenario.effective_dilation).as_dict(),
                "distribution": handoff_distribution(measured, prescribed, self.streamed_handoffs)}
