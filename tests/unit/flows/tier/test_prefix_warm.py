"""What a warmed pool holds when the window begins (flows/tier/prefix_warm.py): the window's past replayed through an
LRU of the pool's capacity, kept to the blocks the window will look up, as writes of consecutive chain blocks."""

from __future__ import annotations

from kvtransit.flows.tier.prefix_warm import WarmPut, warm_plan
from kvtransit.model.serving.traces import BLOCK_TOKENS

B = BLOCK_TOKENS


def _req(ids: tuple[int, ...], extra: int = 100) -> tuple[tuple[int, ...], int]:
    """A request whose prompt covers `ids` as full blocks, plus a partial last block."""
    return ids, len(ids) * B + extra


def test_the_window_finds_exactly_the_leading_blocks_its_past_wrote():
    earlier = [_req((1, 2, 3)), _req((1, 2, 7, 8))]
    window = [_req((1, 2, 3, 4)), _req((1, 2, 7)), _req((9, 10))]
    plan = warm_plan(earlier, window, capacity_blocks=None)
    # Block 8 is held but no window request reaches it; blocks 4, 9, 10 were never written.
    assert sorted(b for p in plan.puts for b in p.hash_ids) == [1, 2, 3, 7]
    assert (plan.earlier_requests, plan.held_blocks, plan.left_out, plan.blocks) == (2, 5, 1, 4)
    # In the LRU's order (the second request's lookup touched 1 and 2 after 3), consecutive blocks of one chain in
    # one put, each from its position in the chain (its KV's tokens).
    assert plan.puts == (WarmPut((3,), 2), WarmPut((1, 2, 7), 0))


def test_a_partial_last_block_is_never_written_nor_warmed():
    earlier = [((1, 2), B + 5)]  # block 2 is partial: the prefill stores only block 1
    window = [((1, 2, 3), 3 * B)]
    plan = warm_plan(earlier, window, capacity_blocks=None)
    assert plan.puts == (WarmPut((1,), 0),)


def test_the_pools_capacity_decides_what_survived_least_recently_used_first():
    earlier = [_req((1, 2)), _req((3, 4)), _req((5, 6))]  # a 4-block pool evicts 1 and 2 for 5 and 6
    window = [_req((1, 2)), _req((3, 4)), _req((5, 6))]
    plan = warm_plan(earlier, window, capacity_blocks=4)
    assert plan.puts == (WarmPut((3, 4), 0), WarmPut((5, 6), 0))  # in LRU order: 3, 4 oldest
    assert plan.held_blocks == 4 and plan.left_out == 0


def test_a_lookup_in_the_past_refreshes_what_it_hits():
    earlier = [_req((1, 2)), _req((3, 4)), _req((1, 2, 9)), _req((5, 6))]  # 1, 2 touched again: 3, 4 go
    window = [_req((1, 2)), _req((3, 4)), _req((5, 6))]
    plan = warm_plan(earlier, window, capacity_blocks=5)
    held = [b for p in plan.puts for b in p.hash_ids]
    assert held == [1, 2, 5, 6] and plan.left_out == 1  # block 9 held, never looked up


def test_nothing_to_warm_without_a_past():
    plan = warm_plan([], [_req((1, 2))], capacity_blocks=None)
    assert plan.puts == () and plan.blocks == 0
