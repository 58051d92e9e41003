"""The twin's speed: the deck's workload on a virtual clock, against the real time a live run of it takes.

    python benchmarks/twin.py [--requests 800] [--repeat 3]

Per point (the slide-03 load and link points, codec none and band-keep), the wall seconds `run_twin` takes (best of
`--repeat`, one process, the encoder's wire sizes cached after the first run as in a sweep), the events it ran, and
two ratios measured in this run: the virtual run's model seconds over its wall (how much faster than real time) and
the twin's wall over the real-time floor of a live run of the same requests (Σ requests ÷ rate: a live run at
dilation 1 cannot take less). The first run of a codec's point pays the encoder's cost once (`first_s`).
"""

from __future__ import annotations

import argparse
import time

from kvtransit.model.scenario import Scenario
from kvtransit.twin.serving import run_twin

DECK = dict(model="llama3-8b", device="h100", prompt_mean=2048, prompt_cv=0.5, output_mean=256, output_cv=0.5,
            seed=1, policy="host")
POINTS = [("eth-25g", 8.0, "none"), ("eth-25g", 14.0, "none"), ("eth-25g", 14.0, "freq-keep-k"),
          ("ib-ndr", 8.0, "none"), ("nvlink4", 8.0, "none")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| link | req/s | codec | first (s) | best wall (s) | events | model s / wall s | wall / live floor |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for link, rate, codec in POINTS:
        scenario = Scenario.build(**DECK, requests=args.requests, link=link, rate=rate, codec=codec)
        walls = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            run = run_twin(scenario)
            walls.append(time.perf_counter() - start)
        best, floor_s = min(walls), args.requests / rate
        print(f"| {link} | {rate:g} | {codec} | {walls[0]:.2f} | {best:.3f} | {run.events:,} | "
              f"{run.run_s / best:,.0f}× | {best / floor_s:.4f} |")


if __name__ == "__main__":
    main()
