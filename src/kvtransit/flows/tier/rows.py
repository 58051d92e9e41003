"""The tier's row of the candidate table (kv-tier-fetch): the `tier-deck` sweep preset's in-transit point, run live
by `kvtransit up` (llama3-70b, 32k prefixes over eth-100g, the Mooncake trace's reuse from a warmed pool);
bottleneck = the mean fetch over the mean E2E; precision by band-keep's task-level loss (kv_rows.py).

Its regime (load × link) is for the twin to map once it models the shared pool (`--kv-pool pool`; it runs the hand-off
and the local tier today): until then the map says so (`Regime.gap`, from the twin's own refusal) and only the row's
own live point stands."""

from __future__ import annotations

from typing import Any

from kvtransit.harness.studies.candidates.kv_rows import ACCURACY_RESULTS, HANDOFF_LINKS, kv_row, launch, mean_of
from kvtransit.harness.studies.candidates.rows import DeckVerdict, Row, RowContext, RowRun
from kvtransit.harness.studies.candidates.table import CANDIDATE, Candidate
from kvtransit.model.judge.five_tests import BOTTLENECK_MIN_SHARE

# requests whose KV decode compares with the exact (the report's accuracy block)
# The tier at the deck's size: the `tier-deck` sweep preset's in-transit point
# (harness/studies/sweep/plan.py: llama3-70b, prefixes up to 32k tokens, the Mooncake conversation trace's reuse from a
# warmed pool), on the row's link. The trace is the shared copy beside the checkout when the working directory has none.
TIER_PRESET, TIER_POINT = "tier-deck", {"compress_at": "transit"}
# The regime's load axis: arrivals at this multiple of the trace's own rate (the preset's 1/1.5 in the middle).
TIER_LOADS = (0.25, 0.5, 2 / 3, 1.0, 1.5)


def tier_scenario(ctx: RowContext) -> Any:
    """The tier row's scenario: the preset's in-transit point with the row's unknowns, link and KV sample."""
    from dataclasses import replace

    from kvtransit.harness.studies.sweep.plan import preset

    scenario = preset(TIER_PRESET)[0].scenario(TIER_POINT)
    u = ctx.unknowns
    time_scale = 1 / float(ctx.point["load"]) if "load" in ctx.point else scenario.time_scale
    return replace(scenario, link=ctx.link, module_budget=u.module_budget, transform_charged=bool(u.transform_charged),
                   precision_bits=u.precision_bits, kv_sample=str(ctx.sample_path), time_scale=time_scale)


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
                   modelled_what=("the steps' compute (held on the clock); the link's bytes for a --link rescale: the "
                                  "mean fetch's wire bytes"),
                   notes=(("precision is the hand-off's sampled K/V error in the same run: decode samples hand-offs, "
                          "not fetched blocks"),), extra={"kv_pool": pool or None})


def percent(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else "not measured"


# --- the regime: load × link, for the twin --------------------------------------------------------------------

def _tier_gap(ctx: RowContext) -> str | None:
    """Why the twin cannot map the tier yet: its own refusal of the row's scenario (None once it models the pool)."""
    from kvtransit.twin.serving import unmodelled_flows

    gaps = unmodelled_flows(tier_scenario(ctx))
    return ("the twin has no model of the shared pool's fetches yet (" + "; ".join(gaps) + "); branch twin-flows "
            "adds it, and this map then reads the twin's kv_pool block") if gaps else None


def _tier_model(ctx: RowContext, _own: RowRun, load: float, link: str) -> Any:
    """The twin's run of the row's scenario at `load` on `link`: the mean fetch over the mean E2E, as the live row
    reads its report."""
    from dataclasses import replace

    from kvtransit.harness.studies.candidates.regimes import PointModel
    from kvtransit.twin.report import twin_report
    from kvtransit.twin.serving import run_twin

    point = replace(ctx, point={"load": load, "link": link})
    report = twin_report(run_twin(tier_scenario(point)), wall_s=None)
    fetch, e2e = (report.get("kv_pool") or {}).get("fetch_s_mean"), mean_of(report.get("e2e_s"))
    share = fetch / e2e if isinstance(fetch, int | float) and e2e else None
    return PointModel(share, {"bottleneck": None if share is None else share >= BOTTLENECK_MIN_SHARE})


def _tier_regime() -> Any:
    from kvtransit.harness.studies.candidates.regimes import Axis, Regime
    from kvtransit.model.catalog.links import LINKS

    return Regime(Axis("load", "load (× the trace's rate)", TIER_LOADS, "x"),
                  Axis("link", "link", HANDOFF_LINKS, choices=tuple(LINKS)), _tier_model,
                  "the twin (kvtransit.twin) with the shared pool: the row's scenario at each load and link",
                  home=lambda ctx: (float(ctx.point.get("load", 2 / 3)), ctx.link), gap=_tier_gap)


def tier_spec() -> Any:
    from kvtransit.harness.studies.candidates.spec import codec_case

    return codec_case("one fetch of a 32,768-token prefix (docs/reference.md §7.1)", "llama3-70b", 32768, "eth-100g",
                      bits_from=ACCURACY_RESULTS)


ROWS = (
    Row(Candidate("kv-tier-fetch",
                  "a cached prefix's KV fetched from the KV pool through the middlebox (--kv-pool pool)",
              "band-keep (freq-keep-k, DCT, keep 0.5; model/catalog/codecs.py)",
              "the task-level loss on a real model within +1 % perplexity (docs/results/accuracy.json); the K/V "
              "error against the equal-bytes baseline as context"),
        link="eth-100g", order=1, run=row_kv_tier_fetch,
        deck=DeckVerdict(CANDIDATE, "the best inference candidate"), regime=_tier_regime(), spec=tier_spec),
)
