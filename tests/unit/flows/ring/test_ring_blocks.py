"""A ring rank's blocks and the codec on its links (flows/ring/blocks.py): the sample split as the offline
measure splits it, real encoded bytes, fresh analogue noise every hop, and a block that is not this ring's is
refused with what was wrong."""

from __future__ import annotations

import numpy as np
import pytest

from kvtransit.cli.accuracy import default_sample_path
from kvtransit.flows.ring.blocks import BlockError, LinkCodec, RingKV
from kvtransit.kernels.ring_attention import block_bounds

SAMPLE = str(default_sample_path())


@pytest.mark.parametrize("n", [2, 4, 8])
def test_each_rank_holds_its_tokens_of_the_sample_and_the_last_holds_the_queries(n):
    kv = RingKV.load(SAMPLE, "prose", n)
    assert kv.bounds == block_bounds(384, n)
    start, end = kv.bounds[1]
    block = kv.block(1, 7)  # model layer 7 carries the sample's layer 7 mod 6 = 1
    assert block.shape == (1, 2, 3, 384 // n, 64) and block.dtype == np.float32
    np.testing.assert_array_equal(block[0, 0], kv.sample.k[1, :, start:end])
    np.testing.assert_array_equal(block[0, 1], kv.sample.v[1, :, start:end])
    assert kv.query_rank() == n - 1  # the decode queries sit at positions 352..383


def test_float16_on_the_wire_carries_the_sample_exactly_and_bfloat16_rounds_it():
    kv = RingKV.load(SAMPLE, "prose", 4)
    block = kv.block(2, 0)
    exact = LinkCodec("none", wire_dtype="float16")
    np.testing.assert_array_equal(exact.decode(exact.encode(block, 1), block.shape), block)
    rounded = LinkCodec("none")
    back = rounded.decode(rounded.encode(block, 1), block.shape)
    assert not np.array_equal(back, block)
    assert np.max(np.abs(back - block) / np.maximum(np.abs(block), 1e-3)) <= 2 ** -8  # BF16's half-ulp


def test_band_keep_sends_fewer_bytes_and_draws_fresh_noise_every_hop():
    kv = RingKV.load(SAMPLE, "prose", 4)
    block = kv.block(0, 0)
    codec = LinkCodec("freq-keep-k", {"keep": 0.5, "sinks": 4, "precision_bits": 8})
    first, second = codec.encode(block, 1), codec.encode(block, 2)
    assert len(first) < 0.55 * kv.raw_bytes()
    assert first != second and codec.encode(block, 1) == first  # seeded by the hop: fresh, and reproducible


def test_a_block_that_is_not_this_rings_is_refused_with_what_was_wrong():
    kv = RingKV.load(SAMPLE, "prose", 4)
    codec = LinkCodec("none")
    wire = codec.encode(kv.block(0, 0), 1)
    with pytest.raises(BlockError, match=r"decoded to shape \(1, 2, 3, 96, 64\), expected \(1, 2, 3, 48, 64\)"):
        codec.decode(wire, (1, 2, 3, 48, 64))
    with pytest.raises(BlockError, match="has no header length"):
        codec.decode(b"\x00", (1, 2, 3, 96, 64))
    with pytest.raises(BlockError, match="unknown wire dtype 'int8'"):
        LinkCodec("none", wire_dtype="int8")
