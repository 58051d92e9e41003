"""The switch's n-stream sum against a bare numpy add of the same arrays, side by side in one run.

    python benchmarks/switch_sum.py [--ranks 2 4 8] [--values 8192 1048576 16777216] [--repeats 20]

For each n and size, n BF16 streams of the payloads a TP group sends (flows/tp/rank/payloads.py) are summed
three ways, interleaved round by round so the box's noise falls on all three alike:
- "switch": what the switch does per collective: the n parts taken in through `GroupReducer.accept` (a view of
  each received buffer), summed by `kernels/stream_sum.sum_streams` a block at a time (`reducer.blocked_sum`: float32
  accumulation, one rounding to BF16),
  the module budget and energy bookkeeping included;
- "sum_streams": the kernel alone, over whole streams;
- "numpy add": a bare `np.add` chain over the same BF16 arrays (ml_dtypes' bfloat16 add, rounding every add).
Throughput is input bytes (n × S) per second, the best of `--repeats` rounds; the ratio is switch / numpy add
(the target: ≥ 0.5×).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kvtransit.flows.tp.rank.payloads import Payloads
from kvtransit.flows.tp.switch.reducer import GroupReducer
from kvtransit.kernels.stream_sum import sum_streams


def _numpy_add(parts: list[np.ndarray]) -> np.ndarray:
    total = parts[0] + parts[1]
    for part in parts[2:]:
        np.add(total, part, out=total)
    return total


def measure(n: int, values: int, repeats: int) -> dict[str, float]:
    payloads = Payloads(values, n)
    parts = [payloads.part(r, 0, 0).copy() for r in range(n)]
    wire = [p.tobytes() for p in parts]
    best = {"switch": float("inf"), "sum_streams": float("inf"), "numpy add": float("inf")}
    for _ in range(repeats):
        reducer = GroupReducer(group=1, size=n)
        t = time.perf_counter()
        done = None
        for rank in range(n):
            done = reducer.accept(1, rank, 0, 0, wire[rank], 0)
        best["switch"] = min(best["switch"], time.perf_counter() - t)
        assert done is not None and payloads.is_exact_sum(done.total, 0, 0)
        t = time.perf_counter()
        sum_streams(parts)
        best["sum_streams"] = min(best["sum_streams"], time.perf_counter() - t)
        t = time.perf_counter()
        _numpy_add(parts)
        best["numpy add"] = min(best["numpy add"], time.perf_counter() - t)
    nbytes = n * values * 2
    return {name: nbytes / seconds for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--values", type=int, nargs="+", default=[8192, 1 << 20, 1 << 24])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print("| n | values a stream | switch (GB/s in) | sum_streams (GB/s) | numpy add (GB/s) | switch / numpy add |")
    print("|---|---|---|---|---|---|")
    for n in args.ranks:
        for values in args.values:
            rates = measure(n, values, max(3, args.repeats if values < 1 << 24 else args.repeats // 4))
            print(f"| {n} | {values:,} | {rates['switch'] / 1e9:.2f} | {rates['sum_streams'] / 1e9:.2f} | "
                  f"{rates['numpy add'] / 1e9:.2f} | {rates['switch'] / rates['numpy add']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
