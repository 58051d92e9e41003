"""A layer-wise hand-off that finds the prefill's link idle goes out a layer per loop turn, its first layer made at
once (handoffs.py: HandoffLink.hold): the first layer is due a step / L after the step starts, so it must not wait
for the others to be made. ManualClock and in-memory endpoints: no sockets, no sleeping."""

from __future__ import annotations

import asyncio
import itertools

from kvtransit.agents.prefill.handoffs import HeldHandoff, ReleaseSchedule
from kvtransit.model.serving.layerwise import HANDOFF_LAYERWISE, StepWindow
from kvtransit.runtime.clock import ManualClock
from kvtransit.wire import DType
from kvtransit.wire.events import KvBegin, KvChunk, KvEnd, Request

from ._manual_time import cancel, count_loop_turns, prefill_link_to_memory_middlebox
from ._wire_samples import PAYLOAD

T0 = 10**12
LAYERS = 6
STEP_NS = 6_000_000


class CountedLayers:
    """A streamed hand-off's frames, one chunk a layer, noting which thread made each layer and when."""

    n_layers = LAYERS
    n_segments = 1

    def __init__(self, turns: list[int]):
        self.turns = turns  # the loop turns counted so far (a probe task appends one per turn)
        self.made_at: list[tuple[int, int]] = []  # (layer, loop turns when it was made)

    def layer_chunks(self, layer: int, segment: int = 0, release_ns: int = 0) -> list[KvChunk]:
        self.made_at.append((layer, len(self.turns)))
        return [KvChunk(5, layer=layer, chunk=layer, dtype=DType.BF16, shape=(8, 64), codec_id=0, codec_header=b"",
                        payload=PAYLOAD, raw_bytes=len(PAYLOAD), release_ns=release_ns)]


async def test_an_idle_links_layer_wise_hand_off_has_its_first_layer_made_at_once_and_the_rest_one_per_turn():
    clock = ManualClock(T0)
    link, middlebox, client, _registry = await prefill_link_to_memory_middlebox(clock)
    turns: list[int] = []
    probe = count_loop_turns(turns)
    schedule = ReleaseSchedule(HANDOFF_LAYERWISE, LAYERS, (8,))
    schedule.plan(8, StepWindow(T0, STEP_NS))
    frames = CountedLayers(turns)
    begin = KvBegin(5, prompt_tokens=8, output_tokens=4, n_layers=LAYERS, n_chunks=LAYERS,
                    raw_bytes=LAYERS * len(PAYLOAD), codec="none", first_token_ns=T0 + STEP_NS)
    run = asyncio.create_task(link.run())
    try:
        link.hold(HeldHandoff(Request(request_id=5, prompt_tokens=8, output_tokens=4, sent_ns=T0), client, begin,
                              frames, deadline_ns=T0 + 10**12, schedule=schedule))
        assert [layer for layer, _ in frames.made_at] == [0]  # only the first layer inside the step's own turn
        got = [await middlebox.next_event() for _ in range(LAYERS + 3)]
        assert [type(e).__name__ for e in got] == ["Hello", "KvBegin", *["KvChunk"] * LAYERS, "KvEnd"]
        chunks = [e for e in got if isinstance(e, KvChunk)]
        assert [c.layer for c in chunks] == list(range(LAYERS))
        assert [c.release_ns for c in chunks] == [T0 + (layer + 1) * STEP_NS // LAYERS for layer in range(LAYERS)]
        assert isinstance(got[-1], KvEnd)
        # Made on the loop, one layer per turn: the loop ran other tasks between any two layers.
        made_turns = [turn for _, turn in frames.made_at]
        assert [layer for layer, _ in frames.made_at] == list(range(LAYERS))
        assert all(later > earlier for earlier, later in itertools.pairwise(made_turns[1:]))
    finally:
        await cancel(run, probe)
