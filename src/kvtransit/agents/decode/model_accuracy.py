"""The real model reads the KV that crossed the link (`--kv-sample real`; realmodel/live.py says what is scored).

For each real-KV hand-off decode takes (Scenario.carries_real_kv), the chunks as they arrived, codec'd or raw, go
to a worker process (agents/common/model_worker.py), niced to the bottom so it takes only CPU the run leaves; it
answers with the K and V reconstruction error against the KV the prefill sent (bit for bit, raw KV), and with
`--accuracy model`, the continuation scored over both caches. Nothing here waits on the loop: a request's reading
is a task of its own, and `pending` says how many are still out (the load generator waits for them before its
report, agents/loadgen/model_accuracy_wait.py).

The worker loads the model in the background from decode's start (about 20 s), so decode is ready at once, and the
load generator starts the workload once it has loaded (`loaded` in /stats); were a hand-off to come first, it would
wait for the model in its task, not in the step loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kvtransit.agents.common.model_worker import ModelWorker
from kvtransit.agents.decode.incoming import Incoming
from kvtransit.agents.decode.parts import DecodePart
from kvtransit.agents.skeleton import AgentContext
from kvtransit.model.scenario import REAL_MODEL_KV, Scenario
from kvtransit.realmodel import live
from kvtransit.realmodel.errors import RealModelError
from kvtransit.runtime.metrics import DecodeMetrics
from kvtransit.runtime.tasks import TaskSet

log = logging.getLogger(__name__)

def model_accuracy_parts(agent: Any) -> list[DecodePart]:
    """Decode's real-model part with `--kv-sample real`, else none."""
    return [ModelAccuracy(agent.scenario, agent.metrics)] if agent.scenario.kv_sample == REAL_MODEL_KV else []


class ModelAccuracy(DecodePart):
    """Sums over the real-KV hand-offs read so far, the per-request figures, and what is still pending."""

    name = "real model"

    def __init__(self, scenario: Scenario, metrics: DecodeMetrics) -> None:
        self.scenario = scenario
        self.score_model = scenario.accuracy == "model"
        self._real_requests = scenario.real_kv_requests
        self._metrics = metrics
        # It loads at normal priority (beside the prefill's own load, before the workload starts: the load generator
        # waits for `loaded`), then reads hand-offs niced to the bottom, beside the run it measures.
        self._worker = ModelWorker(nice=0, nice_after_load=live.DECODE_WORKER_NICE, threads=live.WORKER_THREADS)
        self._tasks = TaskSet("real-model accuracy")
        self._loaded: asyncio.Future[None] | None = None
        self.model: dict[str, Any] = {}
        self.failure = ""  # why the worker could not serve at all (then every request fails with it)
        self.pending = 0
        self.sums = dict.fromkeys(live.SUMS, 0.0)
        self.per_request: dict[int, dict[str, Any]] = {}
        self.failed: dict[int, str] = {}
        self.raw_mismatches = 0  # raw real KV that arrived not bit for bit (corruption the CRCs missed)

    def reads_kv(self, request_id: int) -> bool:
        return self.scenario.carries_real_kv(request_id)

    def kv_ready(self, item: Incoming) -> None:
        self.submit(item)  # a task of its own: the real model takes seconds

    def kv_content_mismatches(self) -> int:
        return self.raw_mismatches

    async def start(self, ctx: AgentContext | None = None) -> None:
        await self._worker.start()
        self._loaded = asyncio.ensure_future(self._describe())

    async def _describe(self) -> None:
        try:
            model = await self._worker.call("describe")
            # Every window the run's real-KV requests read, made (and one reading rehearsed) before the workload
            # starts: live_worker.prepare says what reading them for the first time during the run cost.
            windows = {live.window_for(rid) for rid in range(self._real_requests)}
            await self._worker.call("prepare", sorted(windows, key=lambda w: w.name), self.score_model)
            self.model = model
        except RealModelError as exc:
            self.failure = str(exc)
            log.error("real-model accuracy unavailable: %s", exc)

    def submit(self, item: Incoming) -> None:
        """Read this hand-off's KV with the real model, in a task of its own."""
        rid = item.begin.request_id
        self.pending += 1
        self._tasks.spawn(self._read(rid, item.begin.codec, list(item.chunks)), f"real model reads request {rid}")

    async def _read(self, rid: int, codec: str, chunks: list) -> None:
        try:
            assert self._loaded is not None  # start() ran
            await self._loaded
            if self.failure:
                raise RealModelError(self.failure)
            out = await self._worker.call("score", live.window_for(rid), chunks, self.score_model)
        except RealModelError as exc:
            self.failed[rid] = str(exc)
            self._metrics.model_accuracy_requests.labels(outcome="failed").inc()
            log.warning("the real model could not read request %d: %s", rid, exc)
            return
        finally:
            self.pending -= 1
        self._add(rid, codec, out)

    def _add(self, rid: int, codec: str, out: dict[str, Any]) -> None:
        for key in live.SUMS:
            self.sums[key] += float(out.get(key, 0.0))
        if out["raw_mismatch"]:
            self.raw_mismatches += 1
            log.error("request %d: raw real KV differs from what the prefill sent", rid)
        self.per_request[rid] = {"window": out["window"], "tokens": out["tokens"],
                                 **({"top1": out["agree"] / out["scored"], "kl": out["kl"] / out["scored"]}
                                    if out.get("scored") else {})}
        self._metrics.model_accuracy_requests.labels(outcome="measured").inc()
        so_far = live.figures(self.sums)
        if so_far["top1"] is not None and so_far["kl"] is not None:
            self._metrics.model_top1_agreement.labels(codec=codec).set(so_far["top1"])
            self._metrics.model_kl_nats.labels(codec=codec).set(so_far["kl"])

    def stats(self) -> dict[str, Any]:
        """Sums (the load generator pools them over decode instances) and what they say on this instance."""
        return {"accuracy_model": self.figures()}

    def figures(self) -> dict[str, Any]:
        return {"scored_model": self.score_model, "model": self.model.get("name"), "failure": self.failure,
                "loaded": bool(self.model or self.failure),
                "pending": self.pending, "measured": len(self.per_request), "failed": dict(self.failed),
                "raw_mismatches": self.raw_mismatches, "sums": dict(self.sums),
                "per_request": {str(rid): v for rid, v in sorted(self.per_request.items())},
                **live.figures(self.sums)}

    async def close(self) -> None:
        await self._tasks.close()
        if self._loaded is not None and not self._loaded.done():
            self._loaded.cancel()
        await self._worker.close()
