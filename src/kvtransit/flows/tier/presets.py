"""The tier's sweep presets (`kvtransit sweep --preset kvpool | tier-deck`), added to the core's through the registry
(harness/studies/sweep/plan.py: presets)."""

from __future__ import annotations

from typing import Any

from kvtransit.harness.studies.sweep.plan import (
    NEXT_FASTER_LINK,
    PRESET_SCALE,
    Derived,
    Grid,
    Overrides,
    kernel_at,
    preset_emulation,
)
from kvtransit.model.catalog.models import model_by_name

PRESETS: dict[str, tuple[str, list[Any]]] = {}

# The KV tier: 4 shared 2,048-token system prompts (+ ~256-token user parts), light load, over the
# slow eth-25g; no cache, a local cache (no fetch cost), and the pool behind the middlebox without and with
# the band-keep kernel. TTFT excludes the hand-off (docs/reference.md §4), so the codec moves only the fetch's share.
KVPOOL_WORKLOAD = dict(model="llama3-8b", device="h100", gpus=1, prefill=1, decode=1,
                       prefix_workload="system-prompts", system_prompts=4, system_prompt_tokens=2048,
                       prompt_mean=256.0, prompt_cv=0.5, output_mean=64.0, output_cv=0.5, requests=60, rate=2.0,
                       seed=1, link="eth-25g")
PRESETS["kvpool"] = (
    ("prefix reuse over eth-25g, 4 shared 2,048-token system prompts: no cache, local cache, pool without and "
     "with freq-keep-k"),
    [Grid({**KVPOOL_WORKLOAD, **preset_emulation("eth-25g")}, {"kv_pool": ["off", "local", "pool"], "codec": ["none"]}),
     Grid({**KVPOOL_WORKLOAD, **preset_emulation("eth-25g")}, {"kv_pool": ["pool"], "codec": ["freq-keep-k"]})])

# The tier at the deck's size: llama3-70b on 8 H100s an instance, prefixes up to 32,768 tokens over
# eth-100g, the Mooncake conversation trace's own reuse (its hash_ids). The window is 60 requests from the trace's
# request 5,000, the pool warmed with what the 5,000 before left in it: an 8 TB pool (model bytes: a Mooncake-like
# DRAM pool over several nodes, an assumption) then serves 51 % of the window's prompt tokens
# (flows/tier/prefix_warm.py; from a cold pool the same window would find 4 %; measured live, 2026-12-02: 51.2 %).
# Arrivals at 1/1.5 of the trace's ~3.3 req/s: at its own rate the modelled prefill is 136 % busy (before reuse), and
# the run measures a queue, not the tier. Band-keep on the tier's link in transit and at the GPU, and no codec on
# eth-100g and on the next faster link. Half the KV channels the other presets give a link (PRESET_HOST_BUDGET_BPS at
# dilation 2: 6 of 1,024 on eth-100g, so 3; at least one), at dilation 3: measured here (2026-12-02), at 6 channels the
# no-codec point's prefill stalled 150-226 ms at a time (timers 37-45 % of its shortest step late, guard 3 %) and at
# dilation 2 the band-keep point's timers ran 4.1 % late; at 3 channels and dilation 3 every point was faithful, with
# the same figures in model time.
TIER_DECK_DILATION = 3.0


def _kv_dim(fields: Overrides) -> int:
    return model_by_name(fields.get("model", "llama3-8b")).kv_dim


TIER_DECK_SCALE = Derived("tier-deck scale", lambda f: max(1, round(PRESET_SCALE.rule(f) * _kv_dim(f)) // 2)
                          / _kv_dim(f))

MOONCAKE_TRACE = "mooncake-conversation"  # shipped: kvtransit/data/traces/ (PROVENANCE.md there)
TIER_DECK_BASE = dict(model="llama3-70b", device="h100", gpus=8, prefill=1, decode=1, trace=MOONCAKE_TRACE,
                      trace_start=5000, requests=60, time_scale=1.5, context_cap=32768, kv_pool="pool",
                      kv_pool_capacity=8e12, pool_warm="trace", link="eth-100g", codec="freq-keep-k", seed=1,
                      scale=TIER_DECK_SCALE, dilation=TIER_DECK_DILATION)
PRESETS["tier-deck"] = (
    ("the KV tier at the deck's size: llama3-70b, prefixes up to 32k tokens, eth-100g, the Mooncake trace's reuse "
     "(a warmed 8 TB pool): freq-keep-k in transit and at the GPU, no codec, and no codec on the next faster link"),
    [Grid(dict(TIER_DECK_BASE), {"compress_at": [kernel_at("transit"), kernel_at("gpu")]}),
     Grid(dict(TIER_DECK_BASE),
          {"codec": ["none"], "compress_at": ["transit"], "link": ["eth-100g", NEXT_FASTER_LINK]})])


