"""`--pool-warm trace`: the pool starts the run as the trace's requests before `--trace-start` left it.

flows/tier/prefix_warm.py says which blocks (the window's past replayed through an LRU of the pool's capacity, kept to
the blocks the window looks up). Each is made as the prefill makes a write-back of it and compressed by the codec
the write-back would have run, where it would have run (flows/tier/pool_blocks.py: the module's kernel in
transit, the prefill GPU's codec with --compress-at gpu, none without a codec), and stored exactly as such a
write-back is: the window's fetches read the same bytes, at the same wire size, as if the earlier requests had run.

Made by the pool itself, before it says it is ready, so the warm-up crosses no link and no module: it is the state
the window starts from, not part of what the run measures (no link time, energy or module work of the window's is
spent on it). What it did is in the pool's /stats (`warm`) and the report's kv_pool block.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from kvtransit.flows.tier import pool_blocks
from kvtransit.flows.tier.pool.store import BlockStore, StoreCounters, StoredBlock, StoredChunk, split_into_blocks
from kvtransit.flows.tier.prefix import capacity_blocks_for
from kvtransit.flows.tier.prefix_warm import WarmPlan, WarmPut, warm_plan
from kvtransit.flows.tier.section import TierSection
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.traces import BLOCK_TOKENS
from kvtransit.workload.trace_file import load_trace

# Request ids the warm-up's blocks are made for: past any window's (the load generator numbers them from 0), so a
# warmed block's content is never one a window request's own KV repeats.
WARM_WRITER_BASE = 1 << 40


@dataclass(frozen=True)
class WarmReport:
    earlier_requests: int  # the trace's requests before the window
    held_blocks: int  # what an LRU of the pool's capacity held after them
    left_out: int  # of those, blocks no window request looks up (not made)
    blocks: int  # made and stored
    raw_bytes: int  # payload bytes (at the run's scale) before the codec
    stored_bytes: int  # what the store holds for them
    codec: str
    evictions: int  # blocks the warm-up itself evicted (a plan larger than the pool)
    host_s: float  # wall seconds the warm-up took (before the readiness line)

    def as_dict(self, model_bytes_per_byte: float) -> dict:
        d = asdict(self)
        d["raw_bytes"] = self.raw_bytes * model_bytes_per_byte
        d["stored_bytes"] = self.stored_bytes * model_bytes_per_byte
        return d


def plan_for(scenario: Scenario) -> WarmPlan:
    """The blocks the scenario's trace window starts with in the pool."""
    tier_section = TierSection.of(scenario)
    tier = tier_section
    replay = load_trace(scenario)
    window = [(spec.hash_ids, spec.prompt_tokens) for spec in replay.requests]
    capacity = capacity_blocks_for(tier.kv_pool_capacity, scenario.model_spec.kv_bytes(BLOCK_TOKENS))
    return warm_plan(replay.earlier, window, capacity_blocks=capacity, block_tokens=BLOCK_TOKENS)


def stored_blocks(kv, codec, codec_name: str, writer: int, put: WarmPut, *, layers: int) -> list[StoredBlock]:
    """`put`'s blocks as the pool stores a write-back of them by request `writer`: its chunks made as the prefill
    makes them, through `codec` (None: raw), split evenly into the blocks (the pool's own rule, agent.py)."""
    chunks = pool_blocks.write_back_chunks(kv, writer, put.first, put.first + len(put.hash_ids), layers=layers,
                                           block_tokens=BLOCK_TOKENS, codec=codec, codec_name=codec_name)
    return split_into_blocks(put.hash_ids, codec_name, [StoredChunk.of(c) for c in chunks],
                             per_block=len(chunks) // len(put.hash_ids))


def warm(scenario: Scenario, store: BlockStore) -> WarmReport:
    """Fill `store` with the plan's blocks, least recently used first (so its LRU order is the plan's). Blocking
    (numpy and the codec): run it off the loop."""
    started = time.perf_counter()
    plan = plan_for(scenario)
    layout = scenario.kv_layout
    kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed,
                     sample_path=scenario.kv_sample_path)
    codec = pool_blocks.write_back_codec(scenario)
    codec_name = scenario.codec if codec is not None else "none"
    raw = stored = 0
    for index, put in enumerate(plan.puts):
        blocks = stored_blocks(kv, codec, codec_name, WARM_WRITER_BASE + index, put, layers=layout.layers)
        raw += sum(b.raw_bytes for b in blocks)
        stored += sum(b.nbytes for b in blocks)
        store.put(blocks)
    evictions = store.counters.evictions["memory"]
    store.counters = StoreCounters()  # the window's counters start from the warmed pool, at zero
    return WarmReport(plan.earlier_requests, plan.held_blocks, plan.left_out, plan.blocks, raw, stored, codec_name,
                      evictions, time.perf_counter() - started)
