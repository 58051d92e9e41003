"""A hand-off's frames are a recipe: made a layer at a time when sent, identical every time they are made."""

from __future__ import annotations

from kvtransit.agents.common import kv_frames
from kvtransit.agents.prefill.handoff_frames import HandoffFrames
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.kv_scale import KvLayout
from kvtransit.model.scenario import Scenario
from kvtransit.wire import crc32c

LAYOUT = KvLayout(layers=3, kv_heads=2, head_dim=8)
KV = SyntheticKv(LAYOUT.layers, LAYOUT.kv_heads, LAYOUT.head_dim, seed=7, bank_tokens=256)


def _all_chunks(frames: HandoffFrames):
    return [chunk for layer in range(frames.n_layers) for chunk in frames.layer_chunks(layer)]


def test_raw_frames_carry_the_requests_kv_layer_by_layer_with_their_crc():
    frames = HandoffFrames(request_id=5, tokens=40, layout=LAYOUT, kv=KV, codec=None, codec_name="none")
    chunks = _all_chunks(frames)
    assert len(chunks) == frames.n_chunks == LAYOUT.layers  # one small layer fits one chunk
    assert [c.chunk for c in chunks] == list(range(frames.n_chunks))
    for layer, chunk in enumerate(chunks):
        expected = kv_frames.as_rows(KV.layer(5, layer, 40))
        assert chunk.layer == layer and chunk.raw_bytes == expected.nbytes
        assert bytes(chunk.payload) == expected.tobytes()
        assert chunk.payload_crc == crc32c(bytes(chunk.payload))


def test_a_resend_makes_the_same_bytes_again():
    frames = HandoffFrames(request_id=9, tokens=100, layout=LAYOUT, kv=KV, codec=None, codec_name="none")
    first = [(c.chunk, bytes(c.payload), c.payload_crc) for c in _all_chunks(frames)]
    again = [(c.chunk, bytes(c.payload), c.payload_crc) for c in _all_chunks(frames)]
    assert first == again


def test_gpu_encoded_frames_carry_the_codecs_smaller_payload_and_its_crc():
    scenario = Scenario(codec="freq-keep-k", keep=0.5, sinks=4)
    codec = kv_frames.codec_for(scenario)
    frames = HandoffFrames(request_id=3, tokens=64, layout=LAYOUT, kv=KV, codec=codec, codec_name="freq-keep-k")
    chunks = _all_chunks(frames)
    assert all(c.codec_id == kv_frames.codec_id("freq-keep-k") for c in chunks)
    assert sum(len(c.payload) for c in chunks) < LAYOUT.request_bytes(64)  # the codec cut the bytes
    assert all(c.payload_crc == crc32c(bytes(c.payload)) for c in chunks)
    assert chunks[0].shape == kv_frames.as_rows(KV.layer(3, 0, 64)).shape  # the tensor before the codec


def test_chunked_prefill_frames_cut_each_layer_along_tokens_segment_by_segment_with_their_release_times():
    frames = HandoffFrames(request_id=4, tokens=100, layout=LAYOUT, kv=KV, codec=None, codec_name="none",
                           stops=(40, 100))
    assert frames.segments == ((0, 40), (40, 100)) and frames.n_chunks == 2 * LAYOUT.layers
    made = [(segment, layer, frames.layer_chunks(layer, segment, release_ns=1000 * segment + layer + 1))
            for segment in range(frames.n_segments) for layer in range(LAYOUT.layers)]
    chunks = [chunk for *_, layer_chunks in made for chunk in layer_chunks]
    assert [c.chunk for c in chunks] == list(range(frames.n_chunks))  # the wire's order runs on across segments
    assert [c.release_ns for c in chunks] == [1000 * s + layer + 1 for s, layer, _ in made]
    for layer in range(LAYOUT.layers):
        first, second = (c for c in chunks if c.layer == layer)
        whole = kv_frames.as_rows(KV.layer(4, layer, 100))
        assert first.shape[1] == 40 and second.shape[1] == 60
        assert bytes(first.payload) + bytes(second.payload) != whole.tobytes()  # rows of a segment, not a cut
        assert bytes(first.payload) == whole[:, :40].tobytes() and bytes(second.payload) == whole[:, 40:].tobytes()
