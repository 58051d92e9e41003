"""The run report's `kv_pool` block: what prefix reuse saved and what fetching it cost (model terms).

Joined from the prefills' `/stats` "prefix" blocks (flows/tier/prefix_cache.py), the kvpool's `/stats`
(flows/tier/pool/agent.py) and the client's TTFT. TTFT is split into fetch (the mean time a request waited for its
prefix to arrive, all lookups counted, misses' round trips included) and the rest (queue + the prefill step: compute).
"""

from __future__ import annotations

from typing import Any

from kvtransit.model.scenario import Scenario


def _sum(blocks: list[dict], key: str) -> float:
    return sum(b.get(key) or 0 for b in blocks)


def kv_pool_summary(scenario: Scenario, peer_stats: list[dict], ttft_mean_s: float | None) -> dict[str, Any] | None:
    """None when prefix reuse is off."""
    if scenario.kv_pool == "off":
        return None
    prefixes = [s["prefix"] for s in peer_stats if s.get("role") == "prefill" and isinstance(s.get("prefix"), dict)]
    pools = [s for s in peer_stats if s.get("role") == "kvpool"]
    prompt = _sum(prefixes, "prompt_tokens")
    cached = _sum(prefixes, "cached_tokens")
    lookups: dict[str, int] = {}
    for p in prefixes:
        for outcome, n in p.get("lookups", {}).items():
            lookups[outcome] = lookups.get(outcome, 0) + n
    n_lookups = sum(lookups.values())
    fetch_mean = (_sum(prefixes, "fetch_s") / n_lookups) if n_lookups else None
    raw, wire = _sum(prefixes, "fetch_raw_bytes"), _sum(prefixes, "fetch_wire_bytes")
    summary: dict[str, Any] = {  # a JSON block of the report
        "mode": scenario.kv_pool,
        "hit_rate": cached / prompt if prompt else None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "lookups": lookups,  # hit, miss, pool-down, fetch-failed (the last two: recomputed, with the reason)
        "fetch_raw_bytes": raw,
        "fetch_wire_bytes": wire,
        "fetch_ratio": raw / wire if wire else None,
        "fetch_s_mean": fetch_mean,
        "ttft_split_s": {"fetch": fetch_mean,
                         "compute": (ttft_mean_s - fetch_mean) if ttft_mean_s is not None and fetch_mean is not None
                         else ttft_mean_s},
        # --compress-at gpu: the part of the fetches' time the prefill GPU spent decoding what arrived (model s).
        "fetch_gpu_inverse_s": _sum(prefixes, "fetch_gpu_inverse_s"),
        "writeback_raw_bytes": _sum(prefixes, "writeback_raw_bytes"),
        "pool": None,
    }
    if pools:
        pool = pools[0]
        scale = pool.get("model_bytes_per_byte") or 1.0
        summary["pool"] = {
            "tiers": {tier: {"blocks": t["blocks"], "bytes": t["bytes"] * scale,
                             "capacity_bytes": t["capacity_bytes"] * scale,
                             "occupancy": t["bytes"] / t["capacity_bytes"] if t["capacity_bytes"] else None}
                      for tier, t in pool.get("tiers", {}).items()},
            "evictions": pool.get("evictions"),
            "lookups": pool.get("lookups"),
            "bad_blocks": pool.get("bad_blocks"),
            # --pool-warm trace: what the pool held when the window began (flows/tier/pool/warm.py), model bytes.
            "warm": pool.get("warm"),
        }
    return summary


def kv_pool_headline(report: dict) -> str | None:
    """One line for the terminal and Markdown summaries (None without prefix reuse)."""
    pool = report.get("kv_pool")
    if not pool:
        return None

    def num(value, fmt="{:.3g}"):
        return "-" if value is None else fmt.format(value)

    split = pool["ttft_split_s"]
    line = (f"prefix reuse ({pool['mode']}): hit rate {num(pool['hit_rate'], '{:.1%}')} of prompt tokens, "
            f"lookups {pool['lookups']}; fetched {num(pool['fetch_raw_bytes'])} B raw as "
            f"{num(pool['fetch_wire_bytes'])} B on the wire; TTFT mean = fetch "
            f"{num(split['fetch'] and split['fetch'] * 1e3, '{:.2f}')} ms + compute "
            f"{num(split['compute'] and split['compute'] * 1e3, '{:.2f}')} ms")
    if pool.get("pool"):
        memory = pool["pool"]["tiers"].get("memory", {})
        line += (f"; pool {memory.get('blocks', 0)} blocks, {num(memory.get('occupancy'), '{:.1%}')} full, "
                 f"evictions {pool['pool']['evictions']}, bad blocks {pool['pool']['bad_blocks']}")
        if warm := pool["pool"].get("warm"):
            line += (f"; warmed with {warm['blocks']} blocks of the trace's first {warm['earlier_requests']} "
                     f"requests ({num(warm['stored_bytes'])} B stored, {warm['codec']})")
    return line
