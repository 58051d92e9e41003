"""The real model's own KV, for the requests that carry it (`--kv-sample real`; realmodel/live.py says what and why).

Made once, before the prefill says it is ready: a worker process (agents/common/model_worker.py) loads the model,
prefills each window the sampled requests read, and hands back their BF16 rows; the worker then stops, and the
prefill holds the rows (30 layers × 6 rows × 512 tokens × 64 × 2 B = 11.8 MB a window). A request's hand-off is
then cut from its window's rows like any other (handoff_frames.py: `layer` is SyntheticKv's face), its first T
tokens, T matched to its KV's bytes at the run's scale.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from kvtransit.agents.common.model_worker import ModelWorker
from kvtransit.agents.prefill.handoff_frames import KvSource
from kvtransit.agents.prefill.parts import PrefillPart
from kvtransit.agents.skeleton import AgentContext
from kvtransit.model.kv_scale import KvLayout
from kvtransit.model.scenario import REAL_MODEL_KV, Scenario
from kvtransit.realmodel import live
from kvtransit.realmodel.errors import RealModelError
from kvtransit.wire.events import Request

log = logging.getLogger(__name__)


def real_kv_parts(agent: Any) -> list[PrefillPart]:
    """The prefill's real-KV part with `--kv-sample real`, else none."""
    return [RealKv(agent.scenario)] if agent.scenario.kv_sample == REAL_MODEL_KV else []


class RealKv(PrefillPart):
    """The windows' exact rows, and which tokens of them each real-KV request carries."""

    name = "real KV"

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.layout: KvLayout | None = None  # the real model's, once loaded
        self.model: dict[str, Any] = {}  # what the worker said the model is (file, digest, shape, versions)
        self._rows: dict[str, list[np.ndarray]] = {}  # window name → per layer [2·kv_heads, CONTEXT_MAX, head_dim]
        self.carried: dict[int, live.RealTokens] = {}  # request id → the real tokens its hand-off carried
        self.start_s = 0.0

    async def start(self, ctx: AgentContext) -> None:
        await self.load()  # before we say we are ready: the launcher gives this start extra time

    def kv_source(self, request: Request) -> tuple[KvSource, KvLayout, int] | None:
        """A request that carries real KV: the real model's rows, as many tokens as its bytes at the run's scale."""
        if not self.scenario.carries_real_kv(request.request_id):
            return None
        assert self.layout is not None  # loaded before we said we were ready
        return self, self.layout, self.tokens_for(request.request_id, request.prompt_tokens).tokens

    async def load(self) -> None:
        """Load the model in a worker and make every window the sampled requests read; raises RealModelError."""
        started = time.monotonic()
        worker = ModelWorker(nice=0, threads=live.WORKER_THREADS)
        await worker.start()
        try:
            self.model = await worker.call("describe")
            windows = {live.window_for(rid).name: live.window_for(rid)
                       for rid in range(self.scenario.real_kv_requests)}
            for name, window in windows.items():
                self._rows[name] = await worker.call("exact_rows", window)
        finally:
            await worker.close()
        self.layout = KvLayout(self.model["layers"], self.model["kv_heads"], self.model["head_dim"],
                               self.model["bytes_per_value"])
        self.start_s = time.monotonic() - started
        log.info("real model KV made for %d window(s) in %.1f s", len(self._rows), self.start_s)

    def tokens_for(self, request_id: int, prompt_tokens: int) -> live.RealTokens:
        """The real tokens request `request_id` carries: its KV's bytes at the run's scale (live.real_tokens), at
        least the sink count so that a band-keep codec keeps its sinks exact. Decided once a request (a resend, or the
        release schedule's look, gets the same)."""
        if self.layout is None:
            raise RealModelError("the real model's KV is not made yet (RealKv.load)")
        if request_id in self.carried:
            return self.carried[request_id]
        carried = live.real_tokens(self.scenario.kv_layout.request_bytes(prompt_tokens), self.layout.bytes_per_token,
                                   min_tokens=max(live.MIN_TOKENS, self.scenario.sinks))
        self.carried[request_id] = carried
        return carried

    def layer(self, request_id: int, layer: int, tokens: int) -> np.ndarray:
        """Layer `layer` of the request's real KV, its first `tokens` tokens: [2, kv_heads, tokens, head_dim] BF16,
        the shape SyntheticKv.layer gives."""
        assert self.layout is not None  # tokens_for ran first
        rows = self._rows[live.window_for(request_id).name][layer][:, :tokens]
        return np.ascontiguousarray(rows).reshape(2, self.layout.kv_heads, tokens, self.layout.head_dim)

    def stats(self) -> dict[str, Any]:
        return {"real_kv": {
            "model": self.model.get("name"), "load_s": self.start_s, "windows": sorted(self._rows),
            "requests": {str(rid): {"window": live.window_for(rid).name, "tokens": t.tokens, "wanted": t.wanted}
                         for rid, t in sorted(self.carried.items())},
            "capped": sorted(rid for rid, t in self.carried.items() if t.capped)}}
