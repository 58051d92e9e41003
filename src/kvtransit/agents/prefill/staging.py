"""A prefill step's hand-offs, staged on the KV link as the step begins (docs/reference.md §4: the hand-off starts at
the first token, the end of the step).

Each request's KV goes to the middlebox as soon as the link reaches it (at once, on an idle link), stamped with that
time, and the middlebox holds it until then: the host's own cost of producing, framing and relaying the bytes
overlaps the modelled step instead of landing on the hand-off (which a kernel shaper, tc, could never win back).
The bytes are made as they are sent (handoff_frames.py): what is held is the recipe.

Streamed (layer-wise, chunked prefill), each frame carries its own release time instead (its layer's compute ends
then, model/serving/layerwise.py), and the middlebox holds each until that; with chunked prefill the first token is
not planned yet at the first chunk (KvBegin.first_token_ns 0: decode takes it from the last frame's release time, the
last chunk's end), and each later chunk's step is added to the hand-off's `ReleaseSchedule` as it is planned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtransit.agents.common import kv_frames
from kvtransit.agents.prefill.handoff_frames import HandoffFrames, KvSource
from kvtransit.agents.prefill.handoffs import HANDOFF_DEADLINE_S, HeldHandoff, ReleaseSchedule
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.kv_scale import KvLayout
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE, StepWindow, chunk_stops, kv_segments
from kvtransit.model.serving.prefill_plan import BatchEntry, codec_on_gpu
from kvtransit.runtime.transport import Endpoint
from kvtransit.wire.events import KvBegin, Request

if TYPE_CHECKING:
    from kvtransit.agents.prefill.agent import PrefillAgent


class HandoffStager:
    def __init__(self, agent: PrefillAgent):
        scenario = agent.scenario
        self.agent, self.scenario = agent, scenario
        self.layout = layout = scenario.kv_layout
        self.kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed,
                              sample_path=scenario.kv_sample_path)
        self.gpu_codec = kv_frames.codec_for(scenario) if codec_on_gpu(scenario) else None
        # Layer-wise or chunked: the KV is released as it is computed, not whole at the first token.
        self.streamed = scenario.handoff == HANDOFF_LAYERWISE or scenario.prefill_chunk > 0
        self._schedules: dict[int, ReleaseSchedule] = {}  # streamed hand-offs whose last chunk has not run

    def forget(self, request_id: int) -> None:
        self._schedules.pop(request_id, None)

    def step_handoff(self, request: Request, client: Endpoint, entry: BatchEntry, window: StepWindow) -> None:
        """What this step does to a request's hand-off: staged with its first chunk (the whole prompt without
        chunking); a later chunk's step is added to its release schedule."""
        rid = request.request_id
        if not entry.first_chunk:
            self._schedules[rid].plan(entry.prompt_tokens, window)
        else:
            self._stage(request, client, entry, window)
        if entry.last_chunk:
            self._schedules.pop(rid, None)

    def _stage(self, request: Request, client: Endpoint, entry: BatchEntry, window: StepWindow) -> None:
        first_token_ns = window.end_ns if entry.last_chunk else 0
        schedule = None
        if self.streamed:
            cached = self.agent.cached_tokens(request.request_id)
            stops = kv_segments(chunk_stops(request.prompt_tokens, cached, self.scenario.prefill_chunk),
                                max(1, self.scenario.sinks))
            schedule = ReleaseSchedule(self.scenario.handoff, self.kv_of(request)[1].layers, stops)
            schedule.plan(entry.prompt_tokens, window)
            self._schedules[request.request_id] = schedule
        begin, frames = self.make_frames(request, first_token_ns, schedule.stops if schedule else ())
        self.agent.handoffs.hold(HeldHandoff(request, client, begin, frames, schedule=schedule,
                                             deadline_ns=window.end_ns + round(HANDOFF_DEADLINE_S * 1e9)))

    def make_frames(self, request: Request, first_token_ns: int,
                    stops: tuple[int, ...] = ()) -> tuple[KvBegin, HandoffFrames]:
        """The hand-off's KvBegin and the recipe of its chunks (made when the link sends them); `stops`: its token
        segments (chunked prefill), () for one."""
        source, layout, tokens = self.kv_of(request)
        codec_name = self.scenario.codec if self.gpu_codec is not None else "none"
        codec = self.gpu_codec
        if codec is not None and tokens < self.scenario.sinks:
            codec = kv_frames.codec_for(self.scenario, tokens)
        frames = HandoffFrames(request.request_id, tokens, layout, source, codec, codec_name,
                               stops if len(stops) > 1 else ())
        # The KvBegin keeps the request's own prompt length (decode's batch and KV reservation are the model's); a
        # real-KV hand-off's frames carry its real tokens, and its raw bytes are theirs.
        begin = KvBegin(request_id=request.request_id, prompt_tokens=request.prompt_tokens,
                        output_tokens=request.output_tokens, n_layers=layout.layers, n_chunks=frames.n_chunks,
                        raw_bytes=layout.request_bytes(tokens), codec=codec_name, first_token_ns=first_token_ns)
        return begin, frames

    def kv_of(self, request: Request) -> tuple[KvSource, KvLayout, int]:
        """Where the request's KV comes from, its layout and its tokens: a part's (the real model's, for a request
        that carries real KV), else the synthetic bank over its prompt."""
        for part in self.agent.parts:
            source = part.kv_source(request)
            if source is not None:
                return source
        return self.kv, self.layout, request.prompt_tokens
