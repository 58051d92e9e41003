"""The tier on the twin (model/sections.py `prefix_cache`): `--kv-pool local`'s cache looked up before a request
queues and written back once its step ran, by the live prefill's own rules (flows/tier/prefix.py)."""

from __future__ import annotations

import pytest

from kvtransit.flows.tier.prefix import LocalPrefixCache, PrefixIndex, implied_hit_rate, local_index
from kvtransit.flows.tier.section import TierSection
from kvtransit.model.scenario import Scenario
from kvtransit.twin.report import twin_report
from kvtransit.twin.serving import run_twin


def _scenario(**values) -> Scenario:
    return Scenario.build(**values)


def _system_prompts(rate: float, kv_pool: str = "local", **fields) -> Scenario:
    return _scenario(kv_pool=kv_pool, prefix_workload="system-prompts", system_prompts=4,
                     system_prompt_tokens=2048, prompt_mean=512, prompt_cv=0.5, output_mean=16, output_cv=0.5,
                     requests=60, rate=rate, codec="none", **fields)


def test_a_local_prefix_cache_hits_as_the_pure_estimate_does_at_light_load():
    # One request at a time (a request every 2 s, each done in well under that): every lookup sees every earlier
    # request's write-back, which is what flows/tier/prefix.py's implied_hit_rate assumes.
    scenario = _system_prompts(rate=0.5)
    run = run_twin(scenario)
    prefix = twin_report(run, wall_s=None)["twin_run"]["prefix"]
    tier = TierSection.of(scenario)
    implied = implied_hit_rate([(s.prompt_tokens, s.hash_ids) for s in run.specs], local_index(
        scenario, tier.kv_pool_capacity).capacity_blocks)
    assert prefix["cached_tokens"] == implied.cached_tokens and prefix["prompt_tokens"] == implied.prompt_tokens
    assert prefix["requests_with_hit"] == implied.requests_with_hit >= 50  # all but each system prompt's first
    assert prefix["hit_rate"] == pytest.approx(implied.rate)


def test_a_prefix_hit_cuts_the_prefill_to_the_uncached_part_and_under_load_a_request_misses_what_is_in_flight():
    off = run_twin(_system_prompts(rate=4.0, kv_pool="off"))
    local = run_twin(_system_prompts(rate=4.0))
    assert off.cached_tokens is None
    hits = {rid for rid, cached in local.cached_tokens.items() if cached}
    ttft = {r.request_id: r.ttft_s for r in local.records}
    ttft_off = {r.request_id: r.ttft_s for r in off.records}
    assert all(ttft[rid] < ttft_off[rid] for rid in hits)  # the same requests, their cached prefix not computed
    light = run_twin(_system_prompts(rate=0.5))
    assert sum(local.cached_tokens.values()) <= sum(light.cached_tokens.values())  # lookups before write-backs


def test_the_twin_looks_prefixes_up_with_the_live_caches_own_index():
    scenario = _system_prompts(rate=0.5)
    tier = TierSection.of(scenario)
    cache = tier.prefix_cache(scenario)
    assert isinstance(cache, LocalPrefixCache) and isinstance(cache.index, PrefixIndex)
    assert cache.index.capacity_blocks == local_index(scenario, tier.kv_pool_capacity).capacity_blocks
