"""`kvtransit prefix-hits`: the hit rate a workload implies for a KV pool of a given capacity (no processes run).

The workload is the scenario's: a trace with hash_ids (`--trace`, e.g. the Mooncake traces), or a prefix
workload (`--prefix-workload system-prompts|sessions`). Each request looks up its longest cached prefix, then
writes its full 512-token blocks back, before the next arrives (the light-load bound); the pool is an LRU of
`capacity / (the model's KV bytes of one block)` blocks.

    kvtransit prefix-hits --trace mooncake-conversation --requests 3000 \\
        --capacity 1e12 --capacity 1e11 --capacity 1e10
"""

from __future__ import annotations

from kvtransit.cli._common import add_json_flag, print_json, print_table
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.flows.tier.section import TierSection


def register(subparsers) -> None:
    p = subparsers.add_parser("prefix-hits", help="the KV-pool hit rate a workload implies, per capacity",
                              description=__doc__)
    add_scenario_args(p)
    p.add_argument("--capacity", type=float, action="append", default=None, metavar="BYTES",
                   help="pool capacity in model bytes (repeat for several; default: --kv-pool-capacity)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from kvtransit.flows.tier.prefix import capacity_blocks_for, implied_hit_rate
    from kvtransit.model.serving.traces import BLOCK_TOKENS
    from kvtransit.workload.source import requests_for

    scenario = scenario_from_args(args)
    requests = [(r.prompt_tokens, r.hash_ids) for r in requests_for(scenario)]
    block_bytes = scenario.model_spec.kv_bytes(BLOCK_TOKENS)
    rows = []
    for capacity in args.capacity or [TierSection.of(scenario).kv_pool_capacity]:
        blocks = capacity_blocks_for(capacity, block_bytes)
        hits = implied_hit_rate(requests, blocks)
        rows.append({"capacity_bytes": capacity, "capacity_blocks": blocks, "hit_rate": hits.rate,
                     "requests": hits.requests, "requests_with_hit": hits.requests_with_hit,
                     "cached_tokens": hits.cached_tokens, "prompt_tokens": hits.prompt_tokens,
                     "evictions": hits.evictions})
    if args.json:
        print_json(rows)
    else:
        print_table(f"prefix reuse implied by the workload ({scenario.model}, {BLOCK_TOKENS}-token blocks)",
                    ["capacity (B)", "blocks", "hit rate", "requests hit", "evictions"],
                    [[f"{r['capacity_bytes']:.3g}", str(r["capacity_blocks"]), f"{r['hit_rate']:.1%}",
                      f"{r['requests_with_hit']}/{r['requests']}", str(r["evictions"])] for r in rows])
    return 0
