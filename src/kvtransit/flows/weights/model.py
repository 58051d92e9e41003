"""Weights and LoRA adapters as a flow (docs/reference.md §1, §7): their bytes, their load time, which adapters are
resident.

- `weight_load(model, link)`: a cold start, a model swap or an offload streams the model's BF16 weights
  (`ModelSpec.resident_weight_bytes`, docs/reference.md §1: Llama-3-8B 16.06 GB) in `latency + bytes / bw` (§2).
- `AdapterShape(model, rank)`: a LoRA adapter of rank r on every layer's q/k/v/o projections (S-LoRA,
  arXiv:2311.03285), `2 · r · (d_in + d_out) · 2 B` per projection (docs/reference.md §7), with the model's real
  projection shapes: q and o are d_model → d_model, k and v d_model → kv_dim (grouped-query attention).
- `ZipfPopularity(adapters, exponent, seed)`: which adapter each request names, drawn with a seeded generator,
  so a workload is the same sequence every run.
- `AdapterLru(capacity)`: one instance's resident adapters; `access` says hit or miss and which adapter a miss
  evicted, so the hit/miss sequence of a workload is a pure function of (ids, capacity).

Pure: no I/O, no clock; `random.Random(seed)` is the only randomness.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvtransit.model.catalog.links import Link
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.errors import ConfigError, require_positive

# docs/reference.md §7: "2 · r · (d_in + d_out) · 2 B per projection". The trailing 2 B is BF16 (§1). The leading 2 is
# docs/reference.md's as written: LoRA's A (r × d_in) and B (d_out × r) alone are r · (d_in + d_out) values, so the
# formula counts twice that (kept as docs/reference.md gives it, and named, so one edit changes it if docs/reference.md
# does).
LORA_FORMULA_FACTOR = 2
LORA_BYTES_PER_VALUE = 2  # BF16 (docs/reference.md §1)
# The projections an adapter adapts (docs/reference.md §7: "a layer's q/k/v/o projections").
LORA_PROJECTIONS = ("q", "k", "v", "o")


def weight_bytes(model: ModelSpec) -> int:
    """The model's BF16 weights as stored: every layer, every expert, untied embedding and head (docs/reference.md
    §1)."""
    return model.resident_weight_bytes


@dataclass(frozen=True)
class WeightLoad:
    """One load of `nbytes` over `link` (docs/reference.md §2: latency + bytes / bandwidth)."""

    what: str
    nbytes: int
    link: Link

    @property
    def seconds(self) -> float:
        return self.link.transfer_time_s(self.nbytes)


def weight_load(model: ModelSpec, link: Link) -> WeightLoad:
    """A cold start or swap of `model` over `link` (docs/reference.md §1: Llama-3-8B over pcie5, 0.25 s)."""
    return WeightLoad(f"{model.name} weights", weight_bytes(model), link)


@dataclass(frozen=True)
class AdapterShape:
    """A LoRA adapter of rank `rank` on each of `model`'s layers' q/k/v/o projections (docs/reference.md §7)."""

    model: ModelSpec
    rank: int

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"adapter rank must be an integer >= 1, got {self.rank!r}")
        if self.rank > self.model.d_model:
            raise ConfigError(f"adapter rank {self.rank} exceeds {self.model.name}'s d_model {self.model.d_model} "
                              f"(a low-rank update has rank <= the projection's width)")

    def projection_shape(self, projection: str) -> tuple[int, int]:
        """(d_in, d_out) of one projection: q, o are d_model wide; k, v are kv_heads × head_dim (GQA)."""
        d, kv = self.model.d_model, self.model.kv_dim
        shapes = {"q": (d, d), "k": (d, kv), "v": (d, kv), "o": (d, d)}
        try:
            return shapes[projection]
        except KeyError:
            raise ConfigError(f"unknown projection {projection!r} (choose from: {', '.join(LORA_PROJECTIONS)})") \
                from None

    def projection_bytes(self, projection: str) -> int:
        """2 · r · (d_in + d_out) · 2 B (docs/reference.md §7)."""
        d_in, d_out = self.projection_shape(projection)
        return LORA_FORMULA_FACTOR * self.rank * (d_in + d_out) * LORA_BYTES_PER_VALUE

    @property
    def layer_bytes(self) -> int:
        return sum(self.projection_bytes(p) for p in LORA_PROJECTIONS)

    @property
    def nbytes(self) -> int:
        """The whole adapter: every layer's q/k/v/o."""
        return self.model.layers * self.layer_bytes

    def load(self, link: Link) -> WeightLoad:
        """Paging this adapter in over `link`: latency + bytes / bandwidth (docs/reference.md §2)."""
        return WeightLoad(f"{self.model.name} LoRA r={self.rank}", self.nbytes, link)


class ZipfPopularity:
    """Adapter ids 0..adapters−1 drawn with P(i) ∝ 1 / (i + 1)^exponent (id 0 the most popular), seeded.

    The same (adapters, exponent, seed) gives the same sequence of draws on every run and machine
    (`random.Random` is specified to be reproducible for a given seed)."""

    def __init__(self, adapters: int, exponent: float = 1.0, seed: int = 0) -> None:
        if isinstance(adapters, bool) or not isinstance(adapters, int) or adapters < 1:
            raise ConfigError(f"adapters must be an integer >= 1, got {adapters!r}")
        if not exponent >= 0:
            raise ConfigError(f"Zipf exponent must be >= 0 (0: uniform), got {exponent!r}")
        self.adapters = adapters
        self.exponent = float(exponent)
        weights = [1.0 / (i + 1) ** self.exponent for i in range(adapters)]
        total = sum(weights)
        self.probabilities = tuple(w / total for w in weights)
        self._cumulative = list(itertools.accumulate(self.probabilities))
        self._rng = random.Random(seed)

    def draw(self) -> int:
        u = self._rng.random()
        # min(): the last cumulative sum may round to just below 1.0.
        return min(bisect.bisect_right(self._cumulative, u), self.adapters - 1)

    def draws(self, count: int) -> list[int]:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"count must be an integer >= 0, got {count!r}")
        return [self.draw() for _ in range(count)]


@dataclass(frozen=True)
class AdapterAccess:
    """One request's adapter on one instance: resident (hit) or paged in (miss), and what the miss evicted."""

    adapter: int
    hit: bool
    evicted: int | None = None


class AdapterLru:
    """The adapters resident on one instance, least recently used evicted first, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"adapter slots per instance must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self._resident: OrderedDict[int, None] = OrderedDict()

    @property
    def resident(self) -> tuple[int, ...]:
        """Resident adapters, least recently used first."""
        return tuple(self._resident)

    def access(self, adapter: int) -> AdapterAccess:
        if adapter in self._resident:
            self._resident.move_to_end(adapter)
            return AdapterAccess(adapter, hit=True)
        evicted = None
        if len(self._resident) >= self.capacity:
            evicted, _ = self._resident.popitem(last=False)
        self._resident[adapter] = None
        return AdapterAccess(adapter, hit=False, evicted=evicted)


def page_adapters(adapters: Iterable[int], capacity: int) -> list[AdapterAccess]:
    """The hit/miss sequence of `adapters` requested in order on one instance with `capacity` slots."""
    lru = AdapterLru(capacity)
    return [lru.access(a) for a in adapters]


def adapter_wait_s(accesses: Sequence[AdapterAccess], shape: AdapterShape, link: Link) -> list[float]:
    """What each request waits for its adapter before its prefill (a miss: the load; a hit: 0), one at a time.

    First-order (docs/reference.md §7): no queueing behind another request's load; the live flow measures that."""
    load_s = require_positive("adapter load time", shape.load(link).seconds)
    return [0.0 if a.hit else load_s for a in accesses]


def pull_s(nbytes: float, link: Link, ratio: float = 1.0) -> float:
    """A load the instance asks for: the request's latency, then the answer's latency + bytes / bandwidth
    (docs/reference.md §2), the bytes divided by a lossless kernel's `ratio`."""
    if not ratio > 0:
        raise ConfigError(f"compression ratio must be > 0, got {ratio!r}")
    return 2 * link.latency_s + link.serialisation_s(nbytes / ratio)


@dataclass(frozen=True)
class ServedRequest:
    """One request on an instance that serves one at a time, first come first served (the model of a live run)."""

    arrival_s: float
    adapter: int
    hit: bool
    start_s: float  # when the instance took it: max(arrival, the previous request's first token)
    wait_s: float  # its adapter's load (0 when resident)
    first_token_s: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


def serve_adapter_requests(arrivals_s: Sequence[float], adapters: Sequence[int], capacity: int,
                           load_s: Sequence[float], prefill_s: float) -> list[ServedRequest]:
    """Requests (arrival, adapter) on one instance with `capacity` adapter slots, FIFO, one at a time: a miss waits
    for its load (`load_s[i]`, the i-th request's: its adapter's bytes as the link carried them), then every request
    its prefill, whose end is its first token. Queueing behind earlier requests is counted (the live run's)."""
    if not (len(arrivals_s) == len(adapters) == len(load_s)):
        raise ConfigError("arrivals, adapters and load times must be one per request")
    out: list[ServedRequest] = []
    free_at = float("-inf")
    for arrival, access, load in zip(arrivals_s, page_adapters(adapters, capacity), load_s, strict=True):
        start = max(arrival, free_at)
        wait = 0.0 if access.hit else load
        free_at = start + wait + prefill_s
        out.append(ServedRequest(arrival, access.adapter, access.hit, start, wait, free_at))
    return out
