"""Remote KV's metrics: decode's legs to the pool, the module's scoring of the page summaries (METRICS.md)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from kvtransit.runtime.metrics import counter


@dataclass(frozen=True)
class RemoteKvMetrics:
    """Remote KV with selection (`--kv-placement remote`): decode's legs, the module's scoring (model units)."""

    steps: Counter
    bytes: Counter
    legs_seconds: Counter
    scored_bytes: Counter


def remote_kv_metrics(registry: CollectorRegistry) -> RemoteKvMetrics:
    return RemoteKvMetrics(
        steps=counter(
            registry, "remote_kv_steps",
            "--kv-placement remote: decode steps that fetched remote KV for their long-context requests (top-k or "
            "all, as the run's --select)."),
        bytes=counter(
            registry, "remote_kv_bytes",
            "--kv-placement remote: bytes that crossed the decode link for the remote contexts, model bytes, by leg "
            "(phase: summaries | pages).", ("phase",)),
        legs_seconds=counter(
            registry, "remote_kv_legs_seconds",
            "--kv-placement remote: the steps' remote legs (query -> pages held), model seconds, source=measured (at "
            "decode, as they ran, behind any hand-off on the link) or model (flows/selection/remote_class.py at the "
            "bytes moved, an idle link).", ("source",)),
        scored_bytes=counter(
            registry, "remote_kv_scored_bytes",
            "--kv-placement remote --select top-k: page summaries the module scored (its input), model bytes."),
    )


FACTORIES = {
    "remote_kv": remote_kv_metrics,
}
