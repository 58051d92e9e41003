"""The tier's metrics: the KV pool process, the prefill's prefix cache, the middlebox's pool path (METRICS.md)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvtransit.runtime.metrics import HANDOFF_BUCKETS_S, counter, gauge, histogram

# A pool fetch spans a few µs (one block over NVLink) to seconds (a 32k-token prefix over eth-25g).
POOL_FETCH_BUCKETS_S = HANDOFF_BUCKETS_S


@dataclass(frozen=True)
class KvPoolMetrics:
    """The shared KV pool: blocks held per tier, what it serves, evicts, and refuses (flows/tier/pool/)."""

    blocks: Gauge
    stored_bytes: Gauge
    capacity_bytes: Gauge
    evictions: Counter
    lookups: Counter
    blocks_served: Counter
    served_bytes: Counter
    blocks_put: Counter
    bad_blocks: Counter


def kvpool_metrics(registry: CollectorRegistry) -> KvPoolMetrics:
    return KvPoolMetrics(
        blocks=gauge(registry, "kvpool_blocks", "KV blocks held, by tier (stage=memory or disk).", ("stage",)),
        stored_bytes=gauge(
            registry, "kvpool_stored_bytes",
            "Bytes held, by tier (stage=memory or disk), in the stored (compact when the link compresses) form.",
            ("stage",)),
        capacity_bytes=gauge(registry, "kvpool_capacity_bytes", "Capacity of each tier (stage=memory or disk).",
                              ("stage",)),
        evictions=counter(
            registry, "kvpool_evictions", "Blocks evicted (least recently used first) to make room, by tier.",
            ("stage",)),
        lookups=counter(
            registry, "kvpool_lookups",
            "Fetches answered, by outcome: hit (every block asked for), partial (a leading run), miss (none).",
            ("outcome",)),
        blocks_served=counter(
            registry, "kvpool_blocks_served", "Blocks streamed to fetchers, by the tier they came from.", ("stage",)),
        served_bytes=counter(
            registry, "kvpool_served_bytes", "Payload bytes streamed to fetchers, as stored (compact or raw).",
            ("codec",)),
        blocks_put=counter(
            registry, "kvpool_blocks_put",
            "Blocks written back, by outcome: stored, duplicate (already held), failed (a put whose stream broke or "
            "an Error withdrew, before or after its KvBegin; one per put, not per block).",
            ("outcome",)),
        bad_blocks=counter(
            registry, "kvpool_bad_blocks",
            "Blocks whose CRC32C check failed on read: never served, deleted, reported as a miss.", ("stage",)),
    )


@dataclass(frozen=True)
class PrefixCacheMetrics:
    """The prefill's side of prefix reuse: tokens it did not recompute, and what fetching them cost."""

    prompt_tokens: Counter
    cached_tokens: Counter
    lookups: Counter
    fetch_bytes: Counter
    fetch_seconds: Histogram
    writeback_bytes: Counter


def prefix_cache_metrics(registry: CollectorRegistry) -> PrefixCacheMetrics:
    return PrefixCacheMetrics(
        prompt_tokens=counter(registry, "prefix_prompt_tokens", "Prompt tokens of requests that looked up a prefix."),
        cached_tokens=counter(
            registry, "prefix_cached_tokens",
            "Prompt tokens whose KV came from the cache (not recomputed); hit rate = this / prompt tokens."),
        lookups=counter(
            registry, "prefix_lookups",
            "Prefix lookups by outcome: hit, miss, pool-down (no pool: recomputed), fetch-failed (recomputed).",
            ("outcome",)),
        fetch_bytes=counter(
            registry, "prefix_fetch_bytes",
            "Fetched KV bytes: stage=raw (what they stand for) or wire (what crossed the link).", ("stage",)),
        fetch_seconds=histogram(
            registry, "prefix_fetch_seconds",
            "Prefix fetch time, request to last block in (model seconds); part of TTFT.", POOL_FETCH_BUCKETS_S),
        writeback_bytes=counter(
            registry, "prefix_writeback_bytes", "Raw KV bytes of new blocks written back to the pool."),
    )


@dataclass(frozen=True)
class PoolRelayMetrics:
    """The middlebox's pool path: write-backs compressed once on the way out, fetches over the link."""

    bytes: Counter
    transfer_seconds: Histogram
    requests: Counter


def pool_relay_metrics(registry: CollectorRegistry) -> PoolRelayMetrics:
    return PoolRelayMetrics(
        bytes=counter(
            registry, "pool_relay_bytes",
            "KV bytes on the pool path by phase (fetch, put) and stage (raw: before the codec; wire: on the link).",
            ("phase", "stage")),
        transfer_seconds=histogram(
            registry, "pool_relay_transfer_seconds",
            "Time one fetch or put occupied the pool link (queue + transfer, model seconds), by phase.",
            POOL_FETCH_BUCKETS_S, ("phase",)),
        requests=counter(
            registry, "pool_relay_requests", "Pool fetches and puts relayed, by phase and outcome (ok, failed).",
            ("phase", "outcome")),
    )


FACTORIES = {
    "kvpool": kvpool_metrics,
    "prefix_cache": prefix_cache_metrics,
    "pool_relay": pool_relay_metrics,
}
