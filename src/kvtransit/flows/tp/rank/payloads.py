"""Deterministic all-reduce payloads whose sums are exact, so every rank can check the sum it got back.

A rank's part for (step, collective) is a window of the repeating cycle −4, −3, …, 4 (nine small integers),
shifted by (5·step + 7·collective + 3·rank) mod 9. Every value and every partial sum of up to 8 ranks lies in
[−32, 32]: integers that bfloat16 holds exactly, so a ring's partial sums (rounded to BF16 at every hop) and a
switch's float32 accumulation both give the exact sum, and any other result is a wrong sum, found.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
CYCLE = 9  # values −4..4
# The largest group whose sums stay within BF16's exact integers at |value| ≤ 4: 2^8 / 4 = 64 ranks; 8 is plenty.
MAX_RANKS = 64


def _offset(step: int, collective: int) -> int:
    return (5 * step + 7 * collective) % CYCLE


class Payloads:
    """Parts and expected sums of `values` BF16 values for a group of `size` ranks (views, no copies)."""

    def __init__(self, values: int, size: int):
        if not 1 <= size <= MAX_RANKS:
            raise ValueError(f"group size must be in 1..{MAX_RANKS}, got {size}")
        self.values = values
        self.size = size
        # The cycle repeated (a tile of nine values: ~1 ns a value, where indexing a table of them took ~20).
        repeats = -(-(values + CYCLE) // CYCLE)
        cycle = (np.arange(CYCLE) - CYCLE // 2).astype(np.float32).astype(BF16)
        self._part = np.tile(cycle, repeats)[:values + CYCLE]
        # Σ over ranks of the part at phase m: the same cycle shifted by 3·rank.
        sums = np.array([sum((m + 3 * r) % CYCLE - CYCLE // 2 for r in range(size)) for m in range(CYCLE)])
        self._sum = np.tile(sums.astype(np.float32).astype(BF16), repeats)[:values + CYCLE]

    def phase(self, rank: int, step: int, collective: int) -> int:
        """Which of the CYCLE distinct parts `part` returns: equal phases, equal values."""
        return (_offset(step, collective) + 3 * rank) % CYCLE

    def part(self, rank: int, step: int, collective: int) -> np.ndarray:
        return self.at_phase(self.phase(rank, step, collective))

    def at_phase(self, phase: int) -> np.ndarray:
        return self._part[phase:phase + self.values]

    def expected(self, step: int, collective: int, values: int | None = None) -> np.ndarray:
        """The exact sum of every rank's part, the first `values` of it (default: all `self.values`)."""
        start = _offset(step, collective)
        return self._sum[start:start + (self.values if values is None else values)]

    def is_exact_sum(self, result: np.ndarray, step: int, collective: int, values: int | None = None) -> bool:
        return self.wrong_values(result, step, collective, values) == 0

    def wrong_values(self, result: np.ndarray, step: int, collective: int, values: int | None = None) -> int:
        """How many of `result`'s values differ, bit for bit, from the exact sum of the first `values` (all of
        them when its length is not that)."""
        expected = self.expected(step, collective, values)
        if result.shape != expected.shape:
            return expected.size
        return int(np.count_nonzero(result.view(np.uint16) != expected.view(np.uint16)))
