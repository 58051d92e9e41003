"""The tier's row of the candidate table (kv-tier-fetch): the `tier-deck` sweep preset's in-transit point, run live
by `kvtransit up` (llama3-70b, 32k prefixes over eth-100g, the Mooncake trace's reuse from a warmed pool);
bottleneck = the mean fetch over the mean E2E."""

from __future__ import annotations

from typing import Any

from kvtransit.harness.studies.candidates.kv_rows import kv_row, launch, mean_of
from kvtransit.harness.studies.candidates.rows import Row, RowContext, RowRun
from kvtransit.harness.studies.candidates.table import Candidate

# requests whose KV decode compares with the exact (the report's accuracy block)
# The tier at the deck's size: the `tier-deck` sweep preset's in-transit point
# (harness/studies/sweep/plan.py: llama3-70b, prefixes up to 32k tokens, the Mooncake conversation trace's reuse from a
# warmed pool), on the row's link. The trace is the shared copy beside the checkout when the working directory has none.
TIER_PRESET, TIER_POINT = "tier-deck", {"compress_at": "transit"}


def tier_scenario(ctx: RowContext) -> Any:
    """The tier row's scenario: the preset's in-transit point with the row's unknowns, link and KV sample."""
    from dataclasses import replace

    from kvtransit.harness.studies.sweep.plan import preset

    scenario = preset(TIER_PRESET)[0].scenario(TIER_POINT)
    u = ctx.unknowns
    return replace(scenario, link=ctx.link, module_budget=u.module_budget, transform_charged=bool(u.transform_charged),
                   precision_bits=u.precision_bits, kv_sample=str(ctx.sample_path))


def row_kv_tier_fetch(ctx: RowContext) -> RowRun:
    scenario = tier_scenario(ctx)
    report = launch(ctx, scenario)
    pool = report.get("kv_pool") or {}
    fetch, e2e = pool.get("fetch_s_mean"), mean_of(report.get("e2e_s"))
    share = fetch / e2e if isinstance(fetch, int | float) and e2e else None
    lookups = sum((pool.get("lookups") or {}).values())
    nbytes = (pool.get("fetch_wire_bytes") or 0.0) / lookups if lookups else 0.0
    warm = (pool.get("pool") or {}).get("warm") or {}
    return kv_row(ctx, scenario, report, share=share, share_of="mean pool fetch over mean E2E", nbytes=nbytes,
                   measured_what=(f"the fetch's share of E2E (kv_pool block) at the deck's size: {scenario.model}, "
                                  f"the Mooncake trace's requests {scenario.trace_start}.. with prompts up to "
                                  f"{scenario.context_cap:,} tokens, from a pool warmed with what its first "
                                  f"{warm.get('earlier_requests', scenario.trace_start)} requests left (hit rate "
                                  f"{percent(pool.get('hit_rate'))}); operations, budget, precision and placement "
                                  "from the same run's middlebox (the pool's fetches and write-backs run the same "
                                  "stage chain as the hand-off; decode's accuracy sample is of hand-offs)"),
                   modelled_what="nothing (the link's bytes for a --link rescale: the mean fetch's wire bytes)",
                   notes=(("precision is the hand-off's sampled K/V error in the same run: decode samples hand-offs, "
                          "not fetched blocks"),), extra={"kv_pool": pool or None})


def percent(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else "not measured"


ROWS = (
    Row(Candidate("kv-tier-fetch",
                  "a cached prefix's KV fetched from the KV pool through the middlebox (--kv-pool pool)",
              "band-keep (freq-keep-k, DCT, keep 0.5; model/catalog/codecs.py)",
              "K and V error no worse than the equal-bytes baseline's on the same sampled tensors (five_tests)"),
        link="eth-100g", order=1, run=row_kv_tier_fetch),
)
