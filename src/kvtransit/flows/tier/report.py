"""The run report's `kv_pool` block: what prefix reuse saved and what fetching it cost (model terms).

Joined from the prefills' `/stats` "prefix" blocks (flows/tier/prefix_cache.py), the kvpool's `/stats`
(flows/tier/pool/agent.py) and the client's TTFT. TTFT is split into fetch (the mean time a request waited for its
prefix to arrive, all lookups counted, misses' round trips included) and the rest (queue + the prefill step: compute).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from kvtransit.flows.tier.section import TierSection
from kvtransit.model.cost.energy import link_energy_j
from kvtransit.model.judge import fidelity
from kvtransit.model.scenario import Scenario
from kvtransit.report.blocks import FlowReport, RunData, ms
from kvtransit.report.peer_stats import stat_sum


def _sum(blocks: list[dict], key: str) -> float:
    return sum(b.get(key) or 0 for b in blocks)


def kv_pool_summary(scenario: Scenario, peer_stats: list[dict], ttft_mean_s: float | None) -> dict[str, Any] | None:
    """None when prefix reuse is off."""
    tier_section = TierSection.of(scenario)
    if tier_section.kv_pool == "off":
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
        "mode": tier_section.kv_pool,
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


def pool_fetch_gap(scenario: Scenario, prefills: list[dict]) -> fidelity.Gap:
    """Every answered pool fetch (all prefills', on the one fetch lane) against the lane's FIFO model: the mean
    measured over the mean prescribed, within the live groups' band."""
    fetches = [f for s in prefills for f in (s.get("prefix") or {}).get("fetches") or []]
    if not fetches:
        return fidelity.not_measured("no pool fetch was answered", fidelity.GROUP_TOLERANCE)
    want = fidelity.prescribed_fetches_s(scenario, [(f[0], f[1], f[2], f[4]) for f in fetches])
    return fidelity.model_gap(math.fsum(f[3] for f in fetches) / len(fetches), math.fsum(want) / len(want),
                              scenario.effective_dilation, "pool fetches")


def asked_the_pool(prefills: list[dict]) -> bool:
    """Whether any request named blocks to look up in the pool (a run whose requests name none has no fetch)."""
    return any(sum(((s.get("prefix") or {}).get("lookups") or {}).values()) for s in prefills)




def pool_energy_j(scenario: Scenario, middleboxes: list[dict]) -> float | None:
    """The KV tier's energy (--kv-pool pool): fetches and write-backs over the pool link (its pJ per wire bit)
    plus what the module spent on them (the middlebox's pool-relay counter). None without a pool relay."""
    relays = [m["pool_relay"] for m in middleboxes if isinstance(m.get("pool_relay"), dict)]
    if not relays:
        return None
    wire_bytes = stat_sum(relays, "fetch_wire_bytes") + stat_sum(relays, "put_wire_bytes")
    wire_model_bytes = wire_bytes / scenario.effective_scale
    return link_energy_j(scenario.link_spec, wire_model_bytes) + stat_sum(relays, "module_energy_j")


class TierReport(FlowReport):
    KEY = "kv_pool"
    ENERGY: ClassVar[Mapping[str, str]] = {"pool": "pool"}

    def block(self, run: RunData) -> dict[str, Any] | None:
        """Prefix reuse: hit rate, fetch bytes and time, TTFT split (None when off)."""
        return kv_pool_summary(run.scenario, list(run.peers), run.summary["ttft_s"]["mean"])

    def energy(self, run: RunData) -> dict[str, float | None]:
        return {"pool": pool_energy_j(run.scenario, list(run.middleboxes))}

    def fidelity(self, run: RunData) -> dict[str, fidelity.Gap]:
        prefills = list(run.prefills)
        if TierSection.of(run.scenario).pool and (asked_the_pool(prefills) or not prefills):
            return {"pool_fetch": pool_fetch_gap(run.scenario, prefills)}
        return {}

    def footer(self, report: Mapping[str, Any]) -> list[str]:
        line = kv_pool_headline(dict(report))
        return [line] if line else []

    def columns(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """Prefix reuse's headline figures (extra CSV columns), for runs with --kv-pool local|pool."""
        pool = report.get("kv_pool")
        if not pool:
            return {}
        return {"kv_pool": pool["mode"], "hit_rate": pool["hit_rate"], "ttft_mean_ms": ms(report["ttft_s"]["mean"]),
                "ttft_p50_ms": ms(report["ttft_s"]["p50"]), "fetch_mean_ms": ms(pool["fetch_s_mean"]),
                "fetch_wire_bytes": pool["fetch_wire_bytes"]}


REPORT = TierReport()
