"""Decode's per-request queue waits (KV ready → admitted into the continuous batch), and beside them each
request's hand-off split (exposed / hidden, model/serving/layerwise.py), as the load generator reads them at the end of
a run to complete its records (`RequestRecord.decode_wait_s`) and the report's per-request hidden time.

They have a route of their own, not a key of `/stats`: `/stats` is polled twice a second during a run (the
launcher's progress bar) and must stay small, while this map holds one figure per request taken, read once.
The wire stays as it is: a Tokens entry has room for one stamp, and index 0's is "KV ready".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

QUEUE_WAITS_PATH = "/queue-waits"


class QueueWaits:
    """Decode's side: when each request's KV became ready, and, once admitted, how long it waited (seconds of
    whatever the caller converts to; decode gives model seconds)."""

    def __init__(self) -> None:
        self._ready_ns: dict[int, int] = {}
        self.waits_s: dict[int, float] = {}

    def ready(self, request_id: int, t_ns: int) -> None:
        self._ready_ns[request_id] = t_ns

    def admitted(self, request_id: int, t_ns: int, to_s: Callable[[float], float]) -> float | None:
        """The request's wait (`to_s` of the wall seconds since its KV was ready); None for one never `ready`."""
        ready_ns = self._ready_ns.pop(request_id, None)
        if ready_ns is None:
            return None
        self.waits_s[request_id] = wait_s = to_s((t_ns - ready_ns) / 1e9)
        return wait_s


def queue_waits_body(waits_s: dict[int, float]) -> dict[str, Any]:
    """The route's JSON: `{"queue_wait_s": {"<request id>": model seconds}}` (JSON keys are strings)."""
    return {"queue_wait_s": {str(request_id): wait for request_id, wait in waits_s.items()}}


def parse_queue_waits(body: Any) -> dict[int, float]:
    """The route's JSON back to {request id: model seconds}; anything malformed is ValueError."""
    try:
        return {int(request_id): float(wait) for request_id, wait in body["queue_wait_s"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a decode queue-waits answer: {exc!r}") from None


def handoff_splits_body(splits: Mapping[int, Mapping[str, float]]) -> dict[str, Any]:
    """The same route's other key: `{"handoff_split": {"<request id>": {"exposed_s": ..., "hidden_s": ...}}}`."""
    return {"handoff_split": {str(request_id): dict(split) for request_id, split in splits.items()}}


def parse_handoff_splits(body: Any) -> dict[int, dict[str, float]]:
    """The route's JSON back to {request id: split}; no `handoff_split` key is no splits, anything malformed is
    ValueError."""
    try:
        return {int(request_id): {key: float(value) for key, value in split.items()}
                for request_id, split in body.get("handoff_split", {}).items()}
    except (TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"not a decode hand-off split answer: {exc!r}") from None
