"""The hand-off link in the twin: what a hand-off crosses it as, and its lanes.

**Wire bytes** are what the kernels' real encoder makes of the request's KV at full size (`WireSizer`): the codec
the prefill or the middlebox runs (kernels/registry.py: `scenario_codec`, the parameters the prefill encodes with)
encodes one K row and one V row of the model's head_dim, `tokens` long, and the ratio of its payload to their BF16
bytes scales the whole request's KV. The encoders' sizes depend on the shape alone (FP8 carries its per-block
scales, band-keep its kept band and sinks, KIVI its per-group scales split between keys and values), so those two rows
say what every pair of a layer is: `tests/unit/twin/test_twin_serving.py` holds it against whole full-size layers
encoded as the prefill cuts them. (A live run at scale encodes a narrower head_dim: KIVI's scales then weigh more on
its wire than at full size, which its diff against the twin shows.)

**Time on the link** is what the fidelity guard holds the live link to (model/judge/fidelity.py: the prescribed
serialisation, `wire / bw` or the module's compute when slower, and the prescribed latency, the link's plus the
module's added latency in transit), so the twin and the guard cannot disagree on what a hand-off should take.

**Lanes**: `channels` lanes of the full link rate each (docs/reference.md §4's one FIFO link by default; the user-space
shaper gives every lane the link's rate, runtime/egress.py). A hand-off takes the lane that frees first, in the
order hand-offs were released (FIFO); its parts (one in whole mode, a layer or a chunk each when streamed) leave in
order, each at its release or when the one before it is through (model/serving/layerwise.py: `streamed_ready_s`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np

from kvtransit.kernels.registry import scenario_codec
from kvtransit.model.judge.fidelity import prescribed_latency_s, prescribed_serialise_s
from kvtransit.model.scenario import Scenario


@dataclass(frozen=True)
class _CodecKey:
    """What `scenario_codec` reads of a scenario: a hashable key, so runs of one codec share their sizes."""

    codec: str
    keep: float
    block: int
    sinks: int
    variant: str


@lru_cache(maxsize=65_536)
def _wire_per_kv_byte(key: _CodecKey, head_dim: int, tokens: int) -> float:
    codec = scenario_codec(key, tokens)
    if codec is None:
        return 1.0
    rows = np.zeros((2, tokens, head_dim), ml_dtypes.bfloat16)  # a K row and a V row
    return codec.encode(rows).wire_bytes / rows.nbytes


class WireSizer:
    """Wire bytes of a request's KV under the scenario's codec, at full size (model bytes)."""

    def __init__(self, scenario: Scenario) -> None:
        self.key = _CodecKey(scenario.codec, scenario.keep, scenario.block, scenario.sinks, scenario.variant)
        self.head_dim = scenario.model_spec.head_dim

    def wire_bytes(self, kv_bytes: float, tokens: int) -> float:
        """`kv_bytes` of KV along `tokens` tokens as the wire carries them."""
        return kv_bytes * _wire_per_kv_byte(self.key, self.head_dim, tokens)


@dataclass(frozen=True)
class Part:
    """One piece of a hand-off released to the link: when (model s), its KV bytes and its wire bytes."""

    released_s: float
    kv_bytes: float
    wire_bytes: float


@dataclass(frozen=True)
class Crossing:
    """A hand-off on the link: its lane, when its first part left, when its last was through, when it was all at
    decode (KV ready), and how long it held the lane."""

    lane: int
    start_s: float
    through_s: float
    ready_s: float
    occupancy_s: float


class Lanes:
    """The link's lanes; `cross` books a hand-off on the first to free (ties: the lowest lane)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.latency_s = prescribed_latency_s(scenario)
        self._free_s = [-math.inf] * scenario.channels
        self.busy_s = 0.0  # Σ occupancy over every lane

    def cross(self, parts: Sequence[Part]) -> Crossing:
        if not parts:
            raise ValueError("a hand-off needs at least one part")
        lane = min(range(len(self._free_s)), key=self._free_s.__getitem__)
        through = self._free_s[lane]
        start = max(through, parts[0].released_s)
        occupancy = 0.0
        for part in parts:
            serialise = prescribed_serialise_s(self.scenario, part.kv_bytes, part.wire_bytes)
            through = max(through, part.released_s) + serialise
            occupancy += serialise
        self._free_s[lane] = through
        self.busy_s += occupancy
        return Crossing(lane, start, through, through + self.latency_s, occupancy)
