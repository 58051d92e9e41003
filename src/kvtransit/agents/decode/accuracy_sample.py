"""The codec's real error, measured at decode on the first `size` hand-offs it takes (the accuracy sample).

Each sampled request's chunks are inverted (the codec's decode) and compared with the same synthetic KV made
again here from the scenario's seed, so the report carries the codec's measured reconstruction error. Beside it,
the equal-bytes baseline quantiser (`model.five_tests.equal_bytes_baseline`: fp8 for ratio 2, fp4-block for
about 3.76) runs on those very tensors: the five tests' precision test judges the codec against it (docs/reference.md
§6, §8). Raw KV (no codec) must arrive bit for bit; a difference is counted as corruption the wire's CRCs missed.

`measure` is CPU work of milliseconds a layer, and nothing the product measures may sit on the path it measures:
awaited on the receive path, the first sampled request's measurement held the connection's next hand-off in the
socket (the second hand-off of a front-end run stalled 150–425 ms in 8 of 10 runs, 21.5 ms with `--accuracy-sample
0`). So `submit` only queues it: one worker thread measures the sampled requests in order, niced to the bottom as
the real model's worker is (agents/decode/model_accuracy.py), so it takes the CPU the run leaves; numpy releases the
GIL in the array work. /stats waits for what is queued (`settled`, a part's hook) so the report counts every sample."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kvtransit.agents.common import kv_frames
from kvtransit.agents.decode.incoming import Incoming
from kvtransit.agents.decode.parts import DecodePart
from kvtransit.kernels.accuracy import codec_roundtrip
from kvtransit.kernels.chunk_rows import decoded_layers
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.judge.five_tests import equal_bytes_baseline
from kvtransit.model.scenario import Scenario

log = logging.getLogger(__name__)

# The measuring thread's niceness: the bottom, as the real model's worker (realmodel/live.py: DECODE_WORKER_NICE).
MEASURE_NICE = 19
# How long /stats waits for queued measurements before it reports what is done: under the load generator's /stats
# timeout (runtime/http_client.py: DEFAULT_TIMEOUT_S, 5 s), so a slow queue costs the report samples, never decode's
# stats (a report that came sooner says so: `sampled_requests` below `queued_requests`). Each measurement takes well
# under a second at the scales a live run uses, and the queue is rarely more than one deep at the run's end.
SETTLE_S = 3.0


def _lower_priority() -> None:
    """Linux nices threads one by one (a thread is a task with its own id): only the measuring thread drops."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), MEASURE_NICE)
    except OSError as exc:  # not permitted here: it still runs off the loop, at the agent's priority
        log.warning("the accuracy sample's thread could not be niced: %s", exc)


class AccuracyMeter:
    """Relative reconstruction error of K and V, over the sampled requests: ‖x̂ − x‖ / ‖x‖ over all values."""

    def __init__(self) -> None:
        self.err2 = {"k": 0.0, "v": 0.0}
        self.ref2 = {"k": 0.0, "v": 0.0}
        self.requests = 0

    def add(self, reference: np.ndarray, decoded: np.ndarray, heads: int) -> None:
        ref = reference.astype(np.float32).reshape(2, heads, *reference.shape[-2:])
        got = decoded.astype(np.float32).reshape(ref.shape)
        for i, part in enumerate(("k", "v")):
            self.err2[part] += float(np.sum((got[i] - ref[i]) ** 2))
            self.ref2[part] += float(np.sum(ref[i] ** 2))

    def relative(self, part: str) -> float:
        return (self.err2[part] / self.ref2[part]) ** 0.5 if self.ref2[part] else float("nan")


class AccuracySample(DecodePart):
    """The codec's and the equal-bytes baseline's error on the sampled hand-offs, and the raw-KV mismatch count.

    A part of decode for its lifecycle only (`settled`, `close`); the agent puts `stats()` under its "accuracy" key.
    `error_gauge`: the codec's relative error per (codec, stage = k | v), set after each sampled request."""

    name = "accuracy sample"

    def __init__(self, scenario: Scenario, size: int, error_gauge) -> None:
        self.size = size
        self.layout = scenario.kv_layout
        self._error_gauge = error_gauge
        # The reference KV: built now, not on the first sampled request, so the bank's construction never delays
        # a decode step.
        self._kv = SyntheticKv(self.layout.layers, self.layout.kv_heads, self.layout.head_dim, scenario.seed,
                               sample_path=scenario.kv_sample_path) if size else None
        self.codec = AccuracyMeter()
        # The equal-bytes baseline on the same sampled tensors (none without a codec: nothing to compare).
        self.baseline_codec = None if scenario.codec == "none" else equal_bytes_baseline(
            scenario.codec_declaration.ratio)
        self.baseline = AccuracyMeter()
        self.baseline_bytes = {"raw": 0, "wire": 0}
        self.mismatches = 0  # sampled raw KV that differed from what the prefill made, yet was used
        self.queued = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accuracy-sample",
                                        initializer=_lower_priority) if size else None
        self._pending: set[asyncio.Future[None]] = set()

    def submit(self, item: Incoming) -> None:
        """Queue a sampled hand-off's measurement (module docstring: never awaited where the run waits)."""
        assert self._pool is not None  # only sampled requests get here, and sampling is on only with size > 0
        self.queued += 1
        future = asyncio.get_running_loop().run_in_executor(self._pool, self.measure, item)
        self._pending.add(future)
        future.add_done_callback(functools.partial(self._measured, codec=item.begin.codec))

    def _measured(self, future: asyncio.Future[None], *, codec: str) -> None:
        self._pending.discard(future)
        if future.cancelled():
            return
        if (exc := future.exception()) is not None:
            log.error("the accuracy sample could not measure a request: %r", exc, exc_info=exc)
            return
        for part in ("k", "v"):
            self._error_gauge.labels(codec=codec, stage=part).set(self.codec.relative(part))

    async def settled(self) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=SETTLE_S)

    def kv_content_mismatches(self) -> int:
        return self.mismatches

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def measure(self, item: Incoming) -> None:
        """Invert a sampled hand-off's chunks and add its error (and the baseline's on the same tensors)."""
        layout, tokens = self.layout, item.begin.prompt_tokens
        assert self._kv is not None  # only sampled requests get here, and sampling is on only with the reference
        raw = all(codec_id == kv_frames.IDENTITY_CODEC_ID for _, codec_id, *_ in item.chunks)
        for layer, decoded in decoded_layers(item.chunks, 2 * layout.kv_heads):
            reference = kv_frames.as_rows(self._kv.layer(item.begin.request_id, layer, tokens))
            if raw and decoded.tobytes() != np.ascontiguousarray(reference).tobytes():
                # Raw KV must arrive bit for bit: a difference is corruption the wire's CRCs missed, and it was
                # used. The ledger reports this count (model/judge/ledger_check.py: corrupted), once per request.
                raw = False
                self.mismatches += 1
                log.error("request %d layer %d: raw KV differs from what the prefill made", item.begin.request_id,
                          layer)
            self.codec.add(reference, decoded, layout.kv_heads)
            if self.baseline_codec is not None:
                rows = np.ascontiguousarray(reference)
                baseline, wire_bytes = codec_roundtrip(self.baseline_codec, rows)
                self.baseline.add(reference, baseline, layout.kv_heads)
                self.baseline_bytes["raw"] += rows.nbytes
                self.baseline_bytes["wire"] += wire_bytes
        self.codec.requests += 1

    def stats(self) -> dict:
        """The codec's error, and the equal-bytes baseline's with its measured ratio (raw / wire bytes)."""
        measured = self.baseline_codec is not None and self.baseline_bytes["wire"] > 0
        return {"sampled_requests": self.codec.requests, "queued_requests": self.queued,
                "k_relative_error": self.codec.relative("k"),
                "v_relative_error": self.codec.relative("v"),
                "baseline_codec": self.baseline_codec,
                "baseline_k_relative_error": self.baseline.relative("k") if measured else None,
                "baseline_v_relative_error": self.baseline.relative("v") if measured else None,
                "baseline_ratio": self.baseline_bytes["raw"] / self.baseline_bytes["wire"] if measured else None}
