"""A warmed pool (`--pool-warm trace`, flows/tier/pool/warm.py) holds what the trace's earlier write-backs would have
left, byte for byte; the tier with its codec at the GPU (`--compress-at gpu`) stores and fetches the GPU's compact
form and holds the GPU's decode of it; and a whole run from a warmed pool reuses what the trace's past implies.

In-process paths are the real KvPool, Middlebox + PoolRelay and PrefixReuse over loopback sockets
(tests/integration/flows/tier/test_kvpool.py: `pool_path`); the whole run is the Launcher, every process real.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kvtransit.flows.tier import pool_blocks
from kvtransit.flows.tier.pool.store import BlockStore
from kvtransit.flows.tier.pool.warm import WARM_WRITER_BASE, plan_for, stored_blocks, warm
from kvtransit.flows.tier.prefix import PrefixIndex, storable
from kvtransit.flows.tier.prefix_warm import WarmPut
from kvtransit.harness.up.launcher import Launcher
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.traces import BLOCK_TOKENS
from tests.integration.flows.tier.test_kvpool import _prefix, _request, _write_back, pool_path

pytestmark = pytest.mark.timeout(180)


def _kv(scenario: Scenario) -> SyntheticKv:
    layout = scenario.kv_layout
    return SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed)


@pytest.mark.parametrize("fields", [dict(codec="freq-keep-k"), dict(codec="fp8", policy="host"), dict(codec="none"),
                                    dict(codec="freq-keep-k", compress_at="gpu")],
                         ids=["band-keep in transit", "fp8 on the middlebox's host", "no codec",
                              "band-keep at the GPU"])
async def test_a_warmed_block_is_byte_for_byte_what_a_write_back_through_the_middlebox_stores(fields):
    scenario = Scenario.build(link="eth-100g", kv_pool="pool", **fields)
    ids = _prefix("doc", 3)
    async with pool_path(scenario) as (pool, _server, _relay, reuse):
        await _write_back(reuse, 7, ids)
        written = pool.store.fetch(ids)
    codec = pool_blocks.write_back_codec(scenario)
    made = stored_blocks(_kv(scenario), codec, scenario.codec if codec is not None else "none", 7, WarmPut(ids, 0),
                         layers=scenario.kv_layout.layers)
    assert len(written) == 3 and written == made  # codec name, every chunk's shape, header, payload, raw size


async def test_at_the_gpu_the_tier_moves_the_gpus_compact_form_and_the_fetch_holds_its_decode():
    scenario = Scenario.build(link="eth-100g", kv_pool="pool", codec="freq-keep-k", compress_at="gpu")
    ids = _prefix("doc", 4)
    async with pool_path(scenario) as (_pool, _server, relay, reuse):
        await _write_back(reuse, 1, ids)
        hit = await reuse.lookup(_request(2, ids))
        stats = relay.stats()
    assert hit.hit_blocks == 4 and hit.wire_bytes / hit.raw_bytes == pytest.approx(0.5, abs=0.02)
    assert stats["put_wire_bytes"] == hit.wire_bytes  # the middlebox passed the GPU's bytes through
    assert stats["module_energy_j"] == 0  # no module ran: neither the put nor the fetch charged it
    decode_s = scenario.gpu_codec_fetch_inverse_s(4 * BLOCK_TOKENS)
    assert decode_s > 0 and hit.gpu_inverse_s == decode_s
    # The fetch's measured time includes the held decode, after the bytes crossed the link.
    assert hit.fetch_s > decode_s + hit.wire_bytes / scenario.scaled_link.bandwidth_Bps / scenario.effective_dilation
    assert reuse.stats()["fetch_gpu_inverse_s"] == decode_s


def _trace(tmp_path: Path) -> Path:
    """Five earlier requests, then a window of three: two reuse a prefix the past wrote, one is new."""
    chains = [[0, 1, 2, 3], [0, 1, 4], [0, 5, 6], [7, 8], [0, 1, 2, 9],  # the past
              [0, 1, 2, 3, 10], [0, 5, 11], [12, 13]]  # the window
    lines = [json.dumps({"timestamp": 500 * k, "input_length": len(c) * BLOCK_TOKENS + 40, "output_length": 4,
                         "hash_ids": c}) for k, c in enumerate(chains)]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _implied_hit_tokens(scenario: Scenario) -> int:
    """The window's cached tokens from the trace alone: its past, then itself, through an unbounded LRU."""
    from kvtransit.workload.trace_file import load_trace

    replay, index, cached = load_trace(scenario), PrefixIndex(None), 0
    for ids, prompt in replay.earlier:
        ids = storable(ids, prompt)
        index.insert(ids[index.lookup(ids):])
    for spec in replay.requests:
        ids = storable(spec.hash_ids, spec.prompt_tokens)
        hit = index.lookup(ids)
        cached += hit * BLOCK_TOKENS
        index.insert(ids[hit:])
    return cached


def test_a_warmed_store_holds_the_plan_in_lru_order_with_counters_from_zero(tmp_path):
    scenario = Scenario.build(trace=str(_trace(tmp_path)), trace_start=5, requests=3, kv_pool="pool", pool_warm="trace",
                        codec="freq-keep-k", link="eth-100g")
    plan = plan_for(scenario)
    assert sorted(b for p in plan.puts for b in p.hash_ids) == [0, 1, 2, 3, 5]
    store = BlockStore(10**9)
    report = warm(scenario, store)
    assert (report.blocks, report.earlier_requests, report.codec) == (5, 5, "freq-keep-k")
    assert report.stored_bytes == store.occupancy()["memory"]["bytes"]
    assert report.stored_bytes / report.raw_bytes == pytest.approx(0.5, abs=0.02)
    assert store.counters.put == {"stored": 0, "duplicate": 0, "failed": 0}  # the window counts from here
    assert [b.block_id for b in store.fetch([0, 1, 2, 3])] == [0, 1, 2, 3]
    assert WARM_WRITER_BASE > 10**9  # past any window request id the load generator gives


def test_a_run_from_a_warmed_pool_reuses_what_the_traces_past_implies(tmp_path):
    scenario = Scenario.build(trace=str(_trace(tmp_path)), trace_start=5, requests=3, kv_pool="pool", pool_warm="trace",
                        codec="freq-keep-k", link="eth-25g", output_mean=4.0)
    launcher = Launcher(scenario, report_path=tmp_path / "run.json", drain_timeout_s=20.0, accuracy_sample=0,
                        figures=False, log=lambda _msg: None, links="loopback")
    report = json.loads(asyncio.run(launcher.run()).read_text())
    assert report["requests"]["failed"] == 0
    pool = report["kv_pool"]
    assert pool["cached_tokens"] == _implied_hit_tokens(scenario) == (4 + 2) * BLOCK_TOKENS
    warm_block = pool["pool"]["warm"]
    assert (warm_block["blocks"], warm_block["earlier_requests"]) == (5, 5)
    assert report["workload"]["start"] == 5
    # The warm-up crossed no link: what the middlebox put on the pool link is the window's own write-backs.
    relay = next(a["pool_relay"] for a in report["run"]["agents"] if a["role"] == "middlebox")
    assert relay["put_raw_bytes"] == pool["writeback_raw_bytes"] * report["config"]["effective_scale"]
