"""The host work inside one decode step's remote-KV legs (`kvtransit up --kv-placement remote`), the way each piece
was written before and is now, side by side in one run.

    python benchmarks/remote_legs_host.py [--repeats 50]

A step's legs are held against their modelled link time (flows/selection/remote_class.py: legs_model_s); at the auto
scale that is a few ms a step whatever the dilation, so the pool's page gather and decode's ranking, which run inside
the legs, count against it. For llama3-8b over eth-100g, 8k- and 32k-token contexts at 1/256 (the auto scale at dilation
1) and 1/32, top-k 1/16 of the mean-key pages: the pool's gather of the chosen pages (take_along_axis on the bfloat16
context, before; whole pages as rows of 16-bit words, now: flows/selection/remote_context.py) and the host's top-k (a
stable argsort, before; a partition and the ties in page order, now: kernels/selection.top_k_pages), each checked equal
to the other; the module's scoring beside them for scale.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from kvtransit.flows.selection.remote_context import RemoteContexts, choose, score, step_queries
from kvtransit.flows.selection.section import SelectionSection
from kvtransit.kernels.selection import top_k_pages
from kvtransit.model.scenario import Scenario


def per_call_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def gather_before(contexts: RemoteContexts, rid: int, chosen: np.ndarray) -> bytes:
    s = contexts.shapes
    kv = contexts._context(rid)[0]
    tokens = (chosen[..., None] * s.page_size + np.arange(s.page_size)).reshape(s.layers, s.kv_heads, -1)
    picked = np.take_along_axis(kv[..., :s.pages * s.page_size, :], tokens[:, None, :, :, None], axis=3)
    return np.concatenate([picked, kv[..., s.pages * s.page_size:, :]], axis=3).tobytes()


def stable_sort_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    return np.sort(np.argsort(-scores, axis=-1, kind="stable")[..., :k], axis=-1)


def row(context: int, scale: float, label: str, repeats: int) -> str:
    scenario = Scenario.build(kv_pool="pool", kv_placement="remote", link="eth-100g", scale=scale,
                              remote_context=context, codec="none")
    contexts = RemoteContexts(scenario)
    s = contexts.shapes
    rid = next(i for i in range(1000) if SelectionSection.of(scenario).is_remote_request(scenario, i))
    queries = step_queries(s, scenario.seed, [rid], 0)
    summaries = np.frombuffer(contexts.summaries([rid]), queries.dtype).reshape(s.summary_shape(1))
    scores = score(s, queries, summaries, scenario.precision_bits)
    chosen = choose(s, scores)
    wide = scores.astype(np.float64)
    assert gather_before(contexts, rid, chosen[0]) == contexts.pages([rid], chosen)
    assert np.array_equal(stable_sort_top_k(wide, s.chosen), top_k_pages(wide, s.chosen))
    gather = (per_call_ms(lambda: gather_before(contexts, rid, chosen[0]), repeats),
              per_call_ms(lambda: contexts.pages([rid], chosen), repeats))
    rank = (per_call_ms(lambda: stable_sort_top_k(wide, s.chosen), repeats),
            per_call_ms(lambda: top_k_pages(wide, s.chosen), repeats))
    scoring = per_call_ms(lambda: score(s, queries, summaries, scenario.precision_bits), repeats)
    return (f"| {context:,} | {label} | {s.kv_heads} | {gather[0]:.3f} / {gather[1]:.3f} | "
            f"{gather[0] / gather[1]:.1f} | {rank[0]:.3f} / {rank[1]:.3f} | {rank[0] / rank[1]:.1f} | "
            f"{scoring:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    print("| context | scale | kv heads | gather before / now (ms) | x | top-k before / now (ms) | x | scoring (ms) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for context in (8192, 32768):
        for scale, label in ((1 / 256, "1/256"), (1 / 32, "1/32")):
            print(row(context, scale, label, args.repeats))


if __name__ == "__main__":
    main()
