"""flows/ring/model.py: a ring hop is max(link, block attention), and a codec pays only while the hop is link-bound."""

from __future__ import annotations

import pytest

from kvtransit.flows.ring import model as ring
from kvtransit.model.catalog.codecs import codec_declaration
from kvtransit.model.catalog.devices import device_by_name
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.catalog.models import model_by_name
from kvtransit.model.errors import ConfigError

LLAMA = model_by_name("llama3-8b")
H100 = device_by_name("h100")
ETH = link_by_name("eth-100g")


def test_block_bytes_are_one_layers_k_and_v():
    assert ring.block_bytes(LLAMA, 4096) == 4096 * 2 * 8 * 128 * 2


def test_block_attention_is_four_d_flops_a_pair_on_the_roofline():
    flops = 4 * 4096 * 4096 * 4096
    assert ring.block_attention_s(LLAMA, H100, 4096) == pytest.approx(flops / (989e12 * 0.55))


def test_a_hop_is_the_longer_of_the_transfer_and_the_block_compute():
    h = ring.hop(LLAMA, H100, ETH, 4096)
    assert h.link_s == pytest.approx(20e-6 + ring.block_bytes(LLAMA, 4096) / 12.5e9)
    assert h.total_s == max(h.link_s, h.compute_s) and h.link_bound
    assert ring.hops_per_layer(8) == 7
    assert ring.layer_s(LLAMA, H100, ETH, 4096, 8) == pytest.approx(h.compute_s + 7 * h.total_s)


def test_a_codec_pays_below_the_crossover_bandwidth_and_not_above():
    bw = ring.crossover_bandwidth_Bps(LLAMA, H100, 4096, ETH.latency_s)
    assert bw is not None
    slow = type(ETH)("slow", bw * 0.9, ETH.latency_s, 0.0)
    fast = type(ETH)("fast", bw * 1.1, ETH.latency_s, 0.0)
    assert ring.codec_saving_s(LLAMA, H100, slow, 4096, 2.0) > 0
    assert ring.codec_saving_s(LLAMA, H100, fast, 4096, 2.0) == 0


def test_the_crossover_block_is_the_largest_link_bound_one():
    t = ring.crossover_block_tokens(LLAMA, H100, ETH)
    assert t is not None
    assert ring.hop(LLAMA, H100, ETH, t).link_bound and not ring.hop(LLAMA, H100, ETH, t + 1).link_bound
    assert ring.crossover_block_tokens(LLAMA, H100, link_by_name("nvlink4")) < t  # a faster link hides sooner


def test_a_declared_kernel_runs_through_the_modules_transit_time():
    decl = codec_declaration("freq-keep-k")
    h = ring.hop(LLAMA, H100, ETH, 4096, kernel=decl)
    assert h.link_s == pytest.approx(20e-6 + 1e-6 + ring.block_bytes(LLAMA, 4096) / decl.ratio / 12.5e9)


def test_bad_ring_input_is_refused():
    with pytest.raises(ConfigError, match=r"a ring needs n >= 2 devices \(e.g. 2, 4, 8\), got 1"):
        ring.hops_per_layer(1)
    with pytest.raises(ConfigError, match="block tokens must be an integer >= 1, got 0"):
        ring.block_bytes(LLAMA, 0)
    with pytest.raises(ConfigError, match="codec ratio must be >= 1"):
        ring.hop(LLAMA, H100, ETH, 64, ratio=0.5)
