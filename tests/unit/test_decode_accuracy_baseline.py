"""Decode's accuracy sample: the codec's error on a sampled request's KV, and beside it the equal-bytes baseline
quantiser's error on the very same tensors (the five tests' precision test judges one against the other)."""

from __future__ import annotations

import numpy as np
import pytest
from ml_dtypes import bfloat16

from kvtransit.agents.common import kv_frames
from kvtransit.agents.decode.agent import DecodeAgent
from kvtransit.agents.decode.incoming import Incoming
from kvtransit.agents.process import Address
from kvtransit.kernels.accuracy import relative_error
from kvtransit.kernels.registry import get_codec
from kvtransit.kernels.synthetic_kv import SyntheticKv
from kvtransit.model.scenario import Scenario
from kvtransit.wire.events import KvBegin

ANY = Address("127.0.0.1", 0)
TOKENS = 128
REQUEST = 3


def _sampled(scenario: Scenario) -> tuple[DecodeAgent, np.ndarray, np.ndarray]:
    """A decode agent that measured one sampled request, encoded as the prefill/middlebox encode it; with the
    request's reference K and V ([layers, heads, tokens, hd], float32) made independently here."""
    agent = DecodeAgent(scenario, name="decode-test", listen=ANY, client_listen=ANY, metrics_listen=ANY,
                        accuracy_sample=1)
    layout = scenario.kv_layout
    kv = SyntheticKv(layout.layers, layout.kv_heads, layout.head_dim, scenario.seed)
    codec = kv_frames.codec_for(scenario, TOKENS)
    chunks, refs = [], []
    for layer in range(layout.layers):
        reference = kv.layer(REQUEST, layer, TOKENS)
        refs.append(reference.astype(np.float32))
        rows = kv_frames.as_rows(reference)
        if codec is None:  # codec none: raw BF16 rows, as the prefill sends them
            chunks.append((layer, kv_frames.IDENTITY_CODEC_ID, b"", rows.tobytes(), rows.shape))
            continue
        encoded = codec.encode(rows)
        chunks.append((layer, kv_frames.codec_id(scenario.codec), encoded.header, encoded.payload.tobytes(),
                       rows.shape))
    begin = KvBegin(REQUEST, prompt_tokens=TOKENS, output_tokens=4, n_layers=layout.layers, n_chunks=len(chunks),
                    raw_bytes=sum(r.nbytes // 2 for r in refs), codec=scenario.codec, first_token_ns=1)
    agent.sample.measure(Incoming(begin, 0, sampled=True, chunks=chunks))
    ref = np.stack(refs)  # [layers, 2, heads, tokens, hd]
    return agent, ref[:, 0], ref[:, 1]


def _roundtrip(codec_name: str, part: np.ndarray) -> np.ndarray:
    """Each layer's K or V rows through `codec_name` and back, as one would do it by hand."""
    codec = get_codec(codec_name)
    out = []
    for layer in part:
        enc = codec.encode(layer.astype(bfloat16))
        out.append(codec.decode(enc.header, enc.payload).astype(np.float32))
    return np.stack(out)


@pytest.mark.parametrize("codec, keep, baseline", [("freq-keep-k", 0.5, "fp8"), ("freq-keep-k", 0.25, "fp4-block")])
def test_decode_measures_the_equal_bytes_baseline_on_the_same_sampled_tensors(codec, keep, baseline):
    scenario = Scenario(codec=codec, keep=keep, scale=0.0625)
    agent, k, v = _sampled(scenario)
    accuracy = agent.stats()["accuracy"]
    assert accuracy["sampled_requests"] == 1 and accuracy["baseline_codec"] == baseline
    # fp8 and fp4-block quantise each 64/32-value block of a token's head vector alone, so K and V rows apart
    # give the same result as the layer's rows at once.
    assert accuracy["baseline_k_relative_error"] == pytest.approx(relative_error(k, _roundtrip(baseline, k)), rel=1e-5)
    assert accuracy["baseline_v_relative_error"] == pytest.approx(relative_error(v, _roundtrip(baseline, v)), rel=1e-5)
    expected_ratio = {"fp8": 2 / (1 + 4 / 64), "fp4-block": 64 / 17}[baseline]  # payload + per-block scales
    assert accuracy["baseline_ratio"] == pytest.approx(expected_ratio, rel=1e-3)
    # The kernel's own figures are still the codec's: band-keep on this KV is far worse than the quantiser.
    assert accuracy["baseline_k_relative_error"] < accuracy["k_relative_error"]
    assert accuracy["baseline_v_relative_error"] < accuracy["v_relative_error"]


def test_decode_without_a_codec_measures_no_baseline():
    agent, _, _ = _sampled(Scenario(codec="none", scale=0.0625))
    accuracy = agent.stats()["accuracy"]
    assert accuracy["k_relative_error"] == 0.0 and accuracy["v_relative_error"] == 0.0
    assert accuracy["baseline_codec"] is None and accuracy["baseline_k_relative_error"] is None
