"""A KV pool as a trace's earlier requests left it (`--pool-warm trace`): which blocks it holds when the window
replayed from `--trace-start K` begins.

A replay that starts mid-trace meets a cold pool, and the Mooncake traces' reuse is mostly across requests far
apart (the conversation trace's first 100 requests reuse 4 % of their blocks among themselves; from request
5,000 on, 46 % were written by an earlier request). So the window's past is replayed here, as data: each earlier
request looks up its prefix and writes back the full blocks it lacked, in an LRU of the pool's capacity
(flows/tier/prefix.py: `PrefixIndex`, the same rules the pool and the prefill keep), and what that LRU holds at the end
is what the pool held when the window began.

Only the held blocks that some window request will look up are warmed (a prefix of its full blocks, in the chain):
the others can never be hit, and making them would cost host time and memory for nothing. That is exact while the
capacity does not bind during the window; when it does, the window's write-backs evict fewer earlier blocks than a
full pool would (`WarmPlan.left_out` says how many were left out).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtransit.flows.tier.prefix import PrefixIndex, storable
from kvtransit.model.serving.traces import BLOCK_TOKENS

POOL_WARM_MODES = ("off", "trace")


@dataclass(frozen=True)
class WarmPut:
    """One write-back the warm-up makes: consecutive blocks of one chain, from block `first` of it."""

    hash_ids: tuple[int, ...]
    first: int  # the chain position of hash_ids[0] (its tokens start at first × block_tokens)


@dataclass(frozen=True)
class WarmPlan:
    puts: tuple[WarmPut, ...]  # in the LRU's order, least recently used first
    earlier_requests: int
    held_blocks: int  # what the LRU held after the earlier requests
    left_out: int  # held blocks no window request looks up (not made)

    @property
    def blocks(self) -> int:
        return sum(len(p.hash_ids) for p in self.puts)


def warm_plan(earlier: Sequence[tuple[Sequence[int], int]], window: Sequence[tuple[Sequence[int], int]], *,
              capacity_blocks: int | None, block_tokens: int = BLOCK_TOKENS) -> WarmPlan:
    """The blocks to put in the pool before the window starts.

    `earlier` and `window`: each request's (hash_ids, prompt tokens), prompts already capped as the replay caps
    them. Each earlier request is a lookup, then a write-back of its full blocks past the hit (as the prefill
    does); a window request's reusable blocks are the leading run of its full blocks the LRU holds at the end.
    """
    index = PrefixIndex(capacity_blocks)
    for hash_ids, prompt in earlier:
        ids = storable(hash_ids, prompt, block_tokens)
        hit = index.lookup(ids)
        index.insert(ids[hit:])
    held = index.held()  # least recently used first
    position: dict[int, tuple[tuple[int, ...], int]] = {}  # block → (its chain up to it, its position)
    for hash_ids, prompt in window:
        ids = storable(hash_ids, prompt, block_tokens)
        for k, block in enumerate(ids):
            if block not in index:
                break
            position.setdefault(block, (tuple(ids[:k + 1]), k))
    wanted = [block for block in held if block in position]
    # Consecutive blocks of one chain go in one put (a write-back is a run of a chain's blocks).
    puts: list[WarmPut] = []
    for block in wanted:
        chain, k = position[block]
        last = puts[-1] if puts else None
        if last is not None and last.first + len(last.hash_ids) == k and \
                position[last.hash_ids[-1]][0] == chain[:-1]:
            puts[-1] = WarmPut((*last.hash_ids, block), last.first)
        else:
            puts.append(WarmPut((block,), k))
    return WarmPlan(tuple(puts), len(earlier), len(held), len(held) - len(wanted))
