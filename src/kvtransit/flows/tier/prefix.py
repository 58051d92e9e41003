"""Prefix reuse, as pure data: KV blocks named by chained content hashes, an LRU index of held blocks, and the
hit rate a request stream implies for a pool of a given capacity.

A **block** is `BLOCK_TOKENS` consecutive prompt tokens (512, as in the Mooncake traces' `hash_ids`,
kvtransit/data/traces/PROVENANCE.md). Block k's id hashes block k-1's id with block k's own content, so
equal ids mean equal prefixes up to and including that block: a prefix is a hash chain, and "the longest
cached prefix" is the longest leading run of a request's ids that the pool holds.

Only **full** blocks are stored and reused (a partial last block is recomputed, as vLLM and Mooncake do), and
at least one prompt token is always computed (the last token's logits are the first output token), so the
tokens a hit saves are `min(hit_blocks × BLOCK_TOKENS, prompt_tokens - 1)` (`cached_tokens`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtransit.model.errors import ConfigError
from kvtransit.model.serving.traces import BLOCK_TOKENS

if TYPE_CHECKING:
    from kvtransit.model.scenario import Scenario
    from kvtransit.model.serving.workload import RequestSpec

# Block ids travel as unsigned 64-bit integers on the wire (wire/_frames.py), trace ids are small integers.
HASH_BITS = 63


def chain_hash(parent: int | None, content: Iterable[object]) -> int:
    """The id of a block whose content is named by `content` (any reprs), following block `parent`."""
    digest = hashlib.blake2b(repr((parent, tuple(content))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - HASH_BITS)


def chain(contents: Iterable[Iterable[object]]) -> tuple[int, ...]:
    """Ids of consecutive blocks, each chained on the one before."""
    ids: list[int] = []
    parent = None
    for content in contents:
        parent = chain_hash(parent, content)
        ids.append(parent)
    return tuple(ids)


def full_blocks(prompt_tokens: int, block_tokens: int = BLOCK_TOKENS) -> int:
    """How many whole blocks a prompt has (the ones that can be stored and reused)."""
    return prompt_tokens // block_tokens


def storable(hash_ids: Sequence[int], prompt_tokens: int, block_tokens: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """The ids of the prompt's full blocks (a trace's last id may name a partial block, or the prompt may
    have been capped shorter than the trace's ids cover)."""
    return tuple(hash_ids[:full_blocks(prompt_tokens, block_tokens)])


def cached_tokens(prompt_tokens: int, hit_blocks: int, block_tokens: int = BLOCK_TOKENS) -> int:
    """Prompt tokens a hit of `hit_blocks` leading blocks saves: at least one token is always computed."""
    if prompt_tokens < 1:
        raise ConfigError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    return max(0, min(hit_blocks * block_tokens, prompt_tokens - 1))


class PrefixIndex:
    """Which blocks are held, least recently used first, within `capacity_blocks` (None: unbounded).

    The pool agent keeps one beside its bytes; the prefill's local cache and `implied_hit_rate` use it
    alone. A lookup touches the blocks it hits (they become most recently used)."""

    def __init__(self, capacity_blocks: int | None = None):
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ConfigError(f"pool capacity must be >= 0 blocks, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block: int) -> bool:
        return block in self._lru

    def lookup(self, hash_ids: Sequence[int]) -> int:
        """Length of the leading run of `hash_ids` held; those blocks become most recently used."""
        hits = 0
        for block in hash_ids:
            if block not in self._lru:
                break
            self._lru.move_to_end(block)
            hits += 1
        return hits

    def insert(self, hash_ids: Iterable[int]) -> list[int]:
        """Hold these blocks (most recently used); returns the blocks evicted to make room, oldest first."""
        evicted: list[int] = []
        for block in hash_ids:
            if block in self._lru:
                self._lru.move_to_end(block)
                continue
            if self.capacity_blocks == 0:
                break
            self._lru[block] = None
            while self.capacity_blocks is not None and len(self._lru) > self.capacity_blocks:
                evicted.append(self._lru.popitem(last=False)[0])
        self.evictions += len(evicted)
        return evicted

    def held(self) -> list[int]:
        """The blocks held, least recently used first."""
        return list(self._lru)

    def discard(self, block: int) -> None:
        self._lru.pop(block, None)

    def oldest(self) -> int | None:
        return next(iter(self._lru), None)


@dataclass(frozen=True)
class HitRate:
    prompt_tokens: int
    cached_tokens: int
    requests: int
    requests_with_hit: int
    evictions: int

    @property
    def rate(self) -> float:
        """Cached prompt tokens / prompt tokens (the report's hit rate)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def implied_hit_rate(requests: Iterable[tuple[int, Sequence[int]]], capacity_blocks: int | None,
                     block_tokens: int = BLOCK_TOKENS) -> HitRate:
    """The hit rate a stream of (prompt_tokens, hash_ids) implies for an LRU pool of `capacity_blocks`, when
    each request looks up its prefix, then writes its full blocks back before the next one arrives (light
    load: no request finds its predecessor's blocks still in flight)."""
    index = PrefixIndex(capacity_blocks)
    prompt = cached = n = with_hit = 0
    for prompt_tokens, hash_ids in requests:
        blocks = storable(hash_ids, prompt_tokens, block_tokens)
        saved = cached_tokens(prompt_tokens, index.lookup(blocks), block_tokens)
        index.insert(blocks)
        prompt += prompt_tokens
        cached += saved
        n += 1
        with_hit += saved > 0
    return HitRate(prompt, cached, n, with_hit, index.evictions)


def capacity_blocks_for(capacity_bytes: float, block_bytes: int) -> int:
    """Whole blocks that fit in `capacity_bytes` (block_bytes: one block's stored size)."""
    if block_bytes < 1:
        raise ConfigError(f"block size must be >= 1 byte, got {block_bytes}")
    return max(0, int(capacity_bytes // block_bytes))


def local_index(scenario: Scenario, capacity_bytes: float, block_tokens: int = BLOCK_TOKENS) -> PrefixIndex:
    """A prefill's own cache (`--kv-pool local`): `capacity_bytes` of the modelled KV, in blocks of `block_tokens`."""
    return PrefixIndex(capacity_blocks_for(capacity_bytes, scenario.model_spec.kv_bytes(block_tokens)))


class LocalPrefixCache:
    """`--kv-pool local` as the twin asks it (model/sections.py: `PrefixCache`): the live prefill's rules
    (flows/tier/prefix_cache.py: its lookup and write-back), on the same index, with no fetch: a lookup costs
    nothing."""

    def __init__(self, index: PrefixIndex, block_tokens: int = BLOCK_TOKENS):
        self.index = index
        self.block_tokens = block_tokens
        self._looked_up: dict[int, tuple[tuple[int, ...], int]] = {}  # request id -> (its full blocks, hits)

    def lookup(self, request: RequestSpec) -> int:
        ids = storable(request.hash_ids, request.prompt_tokens, self.block_tokens)
        hits = self.index.lookup(ids) if ids else 0
        self._looked_up[request.request_id] = (ids, hits)
        return cached_tokens(request.prompt_tokens, hits, self.block_tokens)

    def computed(self, request: RequestSpec) -> None:
        ids, hits = self._looked_up.pop(request.request_id, ((), 0))
        if new := ids[hits:]:  # what the step computed that the cache lacked (prefix_cache.py: Lookup.new_blocks)
            self.index.insert(new)
