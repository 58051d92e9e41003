"""`kvtransit candidates`' harness: one short scenario per candidate (docs/reference.md §8), each test measured from its
run.

The rows are harness/studies/candidates/rows.py's `all_rows()`: the core's hand-off row (kv_rows.py) and each flow's
(a flow's `rows.py`). Each row function runs its flow and returns a `RowRun`: the figures
(`harness/studies/candidates/table.py: RowMeasured`) the five tests are judged from, the scale and dilation it ran at,
whether it was faithful, the command that reproduces it, its run directory, and two lines saying what was measured and
what was modelled.

- kv-handoff: a short `kvtransit up` (Launcher, loopback), band-keep in transit, the real-KV sample; bottleneck =
  the report's kv_wait_share.
- kv-tier-fetch: the `tier-deck` preset's in-transit point (llama3-70b, 32k prefixes over eth-100g, the Mooncake
  trace's reuse from a warmed pool); bottleneck = fetch time / E2E.
- tp-all-reduce: `kvtransit collective`, TP4, a switch summing the ranks' streams; the measured all-reduce share.
- moe-all-to-all: `kvtransit collective --ep 2 --dispatch fp8` (ring, the dispatch cast at the GPUs); the measured
  collective share × the model's all-to-all part; FP8's error on the real model's MLP inputs (the realkv extra).
- ring-attention: `kvtransit ring`, 4 ranks passing the real-KV sample's blocks round a shaped ring, raw and with
  band-keep on every hop; the measured prompt's time beyond its held attention, the live ring's output error.
- pq-key-exchange: ML-KEM-768 handshakes over a shaped loopback link (kyber-py); link time / handshake time.
- fhe-inference: the CKKS encrypted layer over the same link (TenSEAL); (up + down) / request time.
- query-aware-selection: `kvtransit select`, a pool, the module scoring the pages' summaries in transit and decode
  over a shaped link, top-k and every token; the every-token fetch's measured share of its step, the error of what
  arrived.
- weight-streaming: `kvtransit weights`, a store and an instance: the cold start, then adapters paged in on
  demand; the adapter waits' measured share of TTFT, every byte checked against what was sent.

Each row's five tests are judged by `harness/studies/candidates/table.py`; this module only measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kvtransit.harness.studies.candidates.rows import RowContext, RowRun, all_rows, default_sample_path, not_run
from kvtransit.harness.studies.candidates.table import Unknowns

__all__ = ["default_sample_path", "run_rows"]


def run_rows(names: tuple[str, ...], unknowns: Unknowns, runs_dir: Path, *, sample_path: Path | None = None,
             log: Callable[[str], None] = print) -> list[RowRun]:
    """Run each named row in table order; a row that fails is a row saying so, not a crash of the table."""
    sample = sample_path or default_sample_path()
    by_name = all_rows()
    runs = []
    for name in names:
        ctx = RowContext(name, unknowns, runs_dir, log, sample)
        log(f"candidates: {name} ...")
        began = time.monotonic()
        try:
            run = by_name[name].run(ctx)
        except Exception as exc:
            from kvtransit.model.catalog.codecs import codec_declaration

            run = not_run(ctx, codec_declaration("none"), f"not run: the run failed: {type(exc).__name__}: {exc}",
                          f"kvtransit candidates --only {name}")
        run.elapsed_s = time.monotonic() - began
        log(f"candidates: {name} done in {run.elapsed_s:.1f} s")
        runs.append(run)
    return runs
