"""Prefix reuse as pure data (flows/tier/prefix.py, flows/tier/workloads.py) and the cached-prefix roofline.

Hit rates are held against counts made here independently: a plain set or OrderedDict over the ids, never
the PrefixIndex under test.
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from pathlib import Path

import pytest

from kvtransit.flows.tier.prefix import (
    BLOCK_TOKENS,
    PrefixIndex,
    cached_tokens,
    chain,
    chain_hash,
    implied_hit_rate,
    storable,
)
from kvtransit.flows.tier.workloads import SessionsSpec, SystemPromptsSpec, sessions, system_prompts
from kvtransit.model.catalog.devices import device_by_name
from kvtransit.model.catalog.models import model_by_name
from kvtransit.model.cost.roofline import (
    STEP_OVERHEAD_S,
    prefill_step_cached_s,
    prefill_step_s,
    prefill_work,
    prefill_work_cached,
)
from kvtransit.model.errors import ConfigError
from kvtransit.model.serving.traces import parse_mooncake, replay
from kvtransit.model.serving.workload import LengthDist
from kvtransit.workload.trace_file import open_trace, trace_path

ROOT = Path(__file__).resolve().parents[4]
LLAMA8B, H100 = model_by_name("llama3-8b"), device_by_name("h100")


# -- hash chains and the index ---------------------------------------------------------------------------

def test_equal_prefixes_give_equal_ids_and_a_difference_changes_every_id_after_it():
    a = chain([("s", 0), ("s", 1), ("u", 7)])
    b = chain([("s", 0), ("s", 1), ("u", 8)])
    c = chain([("x", 0), ("s", 1), ("u", 7)])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert not set(a) & set(c)  # block 1 has the same content as a's, but follows a different block 0
    assert all(0 <= h < 2**63 for h in a)
    assert chain_hash(None, ("s", 0)) == a[0]


def test_lookup_is_the_leading_run_held_and_eviction_is_least_recently_used():
    index = PrefixIndex(capacity_blocks=3)
    index.insert([1, 2, 3])
    assert index.lookup([1, 2, 9, 3]) == 2  # stops at the first block not held
    assert index.insert([4]) == [3]  # 1 and 2 were just used: 3 is the oldest
    assert index.lookup([1, 2, 4]) == 3 and 3 not in index
    assert index.evictions == 1


def test_a_zero_capacity_index_holds_nothing():
    index = PrefixIndex(capacity_blocks=0)
    index.insert([1, 2])
    assert len(index) == 0 and index.lookup([1]) == 0


def test_only_full_blocks_are_storable_and_one_token_is_always_computed():
    assert storable((1, 2, 3), 1100) == (1, 2)  # 1100 tokens: two full 512-token blocks, one partial
    assert cached_tokens(1100, 2) == 1024
    assert cached_tokens(1024, 2) == 1023  # a fully cached prompt still computes its last token
    assert cached_tokens(600, 0) == 0
    with pytest.raises(ConfigError):
        cached_tokens(0, 1)


# -- the cached-prefix roofline --------------------------------------------------------------------------

def test_cached_prefill_with_nothing_cached_is_the_plain_prefill():
    assert prefill_work_cached(LLAMA8B, [(2048, 0), (300, 0)]) == prefill_work(LLAMA8B, [2048, 300])
    # docs/reference.md §3's oracle for a 2,048-token prefill on an H100
    assert prefill_step_cached_s(LLAMA8B, H100, 1, [(2048, 0)]) == pytest.approx(0.059033, abs=5e-7)


def test_cached_prefill_rereads_the_cached_kv_and_computes_only_the_rest():
    s, c = 2304, 2048
    work = prefill_work_cached(LLAMA8B, [(s, c)])
    L, d, n = LLAMA8B.layers, LLAMA8B.d_model, s - c
    assert work.flops == 2 * LLAMA8B.matmul_params * n + 2 * L * d * (s * (s + 1) - c * (c + 1))
    assert work.hbm_bytes == (LLAMA8B.weights_streamed_bytes + 2 * n * d + n * LLAMA8B.kv_bytes_per_token
                              + c * LLAMA8B.kv_bytes_per_token)
    fresh_suffix = prefill_step_s(LLAMA8B, H100, 1, [n])  # the same 256 tokens with no context at all
    full = prefill_step_s(LLAMA8B, H100, 1, [s])
    assert fresh_suffix < prefill_step_cached_s(LLAMA8B, H100, 1, [(s, c)]) < full
    assert prefill_step_cached_s(LLAMA8B, H100, 1, [(s, c)]) > STEP_OVERHEAD_S


@pytest.mark.parametrize("bad", [(100, 100), (100, -1), (100, 1.5)])
def test_cached_tokens_must_leave_at_least_one_token_to_compute(bad):
    with pytest.raises(ConfigError, match="cached tokens"):
        prefill_work_cached(LLAMA8B, [bad])


# -- workloads and the hit rates they imply --------------------------------------------------------------

def _independent_rate(requests, capacity_blocks=None) -> float:
    """Cached prompt tokens / prompt tokens for an LRU of `capacity_blocks`, counted from scratch."""
    held: OrderedDict = OrderedDict()
    cached = total = 0
    for prompt, ids in requests:
        full = ids[:prompt // BLOCK_TOKENS]
        run = 0
        while run < len(full) and full[run] in held:
            held.move_to_end(full[run])
            run += 1
        cached += max(0, min(run * BLOCK_TOKENS, prompt - 1))
        total += prompt
        for block in full:
            held[block] = True
            held.move_to_end(block)
            while capacity_blocks is not None and len(held) > capacity_blocks:
                held.popitem(last=False)
    return cached / total


def test_shared_system_prompts_of_2048_tokens_imply_the_hit_rate_counted_by_hand():
    spec = SystemPromptsSpec(rate=2.0, requests=200, prompts=4, prompt_tokens=2048, user=LengthDist(256, 0.5),
                             output=LengthDist(64, 0.5), seed=3)
    requests = system_prompts(spec)
    # By hand: a request whose system prompt was seen before reuses its 2048 tokens (4 whole blocks). Which
    # prompt it drew is its first block id (blocks 0-3 are the system prompt's own chain).
    seen, cached, total = set(), 0, 0
    for r in requests:
        if r.hash_ids[0] in seen:
            cached += 2048
        seen.add(r.hash_ids[0])
        total += r.prompt_tokens
    assert len(seen) == 4
    expected = cached / total
    assert implied_hit_rate([(r.prompt_tokens, r.hash_ids) for r in requests], None).rate == pytest.approx(expected)
    assert _independent_rate([(r.prompt_tokens, r.hash_ids) for r in requests]) == pytest.approx(expected)
    assert 0.8 < expected < 0.9  # 196 of 200 requests reuse 2048 of ~2300 tokens


def test_the_same_seed_draws_the_same_workloads():
    spec = SessionsSpec(rate=0.5, requests=30, turns=4, think_time_s=5.0, user=LengthDist(300, 0.5),
                        output=LengthDist(200, 0.5), seed=7)
    assert sessions(spec) == sessions(spec)
    sp = SystemPromptsSpec(2.0, 20, 3, 1000, LengthDist(100, 0.5), LengthDist(10, 0.5), seed=7)
    assert system_prompts(sp) == system_prompts(sp)


def test_each_session_turn_extends_the_previous_prompt_and_reuses_its_full_blocks():
    spec = SessionsSpec(rate=0.2, requests=40, turns=4, think_time_s=5.0, user=LengthDist(400, 0.3),
                        output=LengthDist(300, 0.3), seed=2)
    requests = sessions(spec)
    assert [r.request_id for r in requests] == list(range(40))
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(requests))
    # Group turns by their first block (a session's conversation starts with its own block 0).
    by_first: dict[int, list] = {}
    for r in requests:
        by_first.setdefault(r.hash_ids[0], []).append(r)
    multi = [turns for turns in by_first.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for earlier, later in itertools.pairwise(turns):
            assert later.prompt_tokens > earlier.prompt_tokens
            full = earlier.prompt_tokens // BLOCK_TOKENS
            assert later.hash_ids[:full] == earlier.hash_ids[:full]
    rate = implied_hit_rate([(r.prompt_tokens, r.hash_ids) for r in requests], None).rate
    assert rate == pytest.approx(_independent_rate([(r.prompt_tokens, r.hash_ids) for r in requests]))
    assert rate > 0.2


def test_the_trace_excerpt_keeps_its_hash_ids_through_replay():
    lines = (ROOT / "tests" / "data" / "traces" / "mooncake_excerpt.jsonl").read_text().splitlines()
    records = parse_mooncake(lines, "excerpt")
    specs = replay(records, requests=len(records), context_cap=4096).requests
    for record, spec in zip(records, specs, strict=True):
        assert spec.hash_ids == record.hash_ids[:-(-spec.prompt_tokens // BLOCK_TOKENS)]


@pytest.mark.parametrize("capacity_blocks", [None, 2000, 200])
def test_a_mooncake_trace_implies_the_hit_rate_counted_independently(capacity_blocks):
    with open_trace(trace_path("mooncake-conversation")) as handle:
        rows = [json.loads(next(handle)) for _ in range(3000)]
    requests = [(row["input_length"], tuple(row["hash_ids"])) for row in rows]
    got = implied_hit_rate(requests, capacity_blocks)
    assert got.rate == pytest.approx(_independent_rate(requests, capacity_blocks), rel=1e-12)
    assert 0.0 < got.rate < 1.0
    if capacity_blocks == 200:
        assert got.evictions > 0
