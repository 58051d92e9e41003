"""The run's one frozen config: validation, scale and dilation, the workload, and the shared flags."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.model.catalog import model_by_name
from kvtransit.model.errors import ConfigError
from kvtransit.model.link_catalog import link_by_name
from kvtransit.model.scenario import HOST_BUDGET_BPS, Scenario, auto_channels_and_dilation, scaled_layout
from kvtransit.model.workload import generate


def test_defaults_are_the_issues():
    s = Scenario()
    assert (s.model, s.device, s.gpus, s.link, s.codec, s.keep, s.prefill, s.decode) == (
        "llama3-8b", "h100", 1, "eth-25g", "freq-keep-k", 0.5, 1, 1)
    assert s.scale == "auto" and s.dilation == 1.0 and s.compress_at == "transit"


@pytest.mark.parametrize("field,value,expected", [
    ("model", "gpt-9", "model: unknown model 'gpt-9' (choose from: llama3-70b"),
    ("link", "carrier-pigeon", "eth-25g"),
    ("codec", "zip", "choose from: none, fp8, fp4-block, freq-keep-k"),
    ("compress_at", "cpu", "compress_at: unknown value 'cpu' (choose from: transit, gpu)"),
    ("arrival", "uniform", "choose from: poisson, gamma"),
    ("keep", 0.0, "keep: must be > 0 and <= 1"),
    ("scale", 1.5, "scale: must be > 0 and <= 1"),
    ("scale", "big", "scale: expected a number in (0, 1] or 'auto'"),
    ("dilation", 0.5, "dilation: must be >= 1"),
    ("requests", 2.5, "requests: expected a whole number"),
    ("prefill", 0, "prefill: must be >= 1"),
])
def test_bad_values_name_the_field_and_the_choices(field, value, expected):
    with pytest.raises(ConfigError) as err:
        Scenario(**{field: value})
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_a_model_that_does_not_fit_its_gpus_is_refused():
    with pytest.raises(ConfigError, match="does not fit on 1x h100"):
        Scenario(model="llama3-70b", gpus=1)


def test_scenario_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Scenario().rate = 3.0  # type: ignore[misc]


def test_explicit_scale_shrinks_channels_never_tokens_and_effective_scale_is_exact():
    s = Scenario(scale=0.1)  # llama3-8b: kv_dim 8 x 128 = 1024 -> 102 channels (not a multiple of 8 heads)
    layout = s.kv_layout
    assert layout.channels == 102 and layout.layers == 32
    assert s.effective_scale == 102 / 1024
    assert layout.layer_shape(2048) == (2, 1, 2048, 102)
    assert s.scaled_link.bandwidth_Bps == pytest.approx(3.125e9 * 102 / 1024)


def test_full_scale_is_the_models_own_layout():
    layout = Scenario(scale=1.0).kv_layout
    assert (layout.kv_heads, layout.head_dim) == (8, 128)
    assert layout.request_bytes(2048) == 268_435_456  # REFERENCE §1: the 2,048-token hand-off


def test_auto_scale_is_largest_under_host_budget_keeping_heads():
    for link in ("eth-25g", "eth-100g", "ib-ndr"):
        s = Scenario(link=link)
        rate = s.scaled_link.bandwidth_Bps
        assert rate <= HOST_BUDGET_BPS
        kv_heads = model_by_name("llama3-8b").kv_heads
        one_more = link_by_name(link).bandwidth_Bps * (s.kv_layout.channels + kv_heads) / 1024
        assert one_more > HOST_BUDGET_BPS or s.kv_layout.kv_heads == 1
    s = Scenario()  # eth-25g: 3.125 GB/s x 16/1024 = 48.8 MB/s
    assert s.kv_layout.channels == 16 and s.effective_scale == 1 / 64
    assert s.scaled_link.bandwidth_Bps == pytest.approx(48_828_125)


def test_auto_scale_dilates_when_even_one_channel_is_too_fast():
    s = Scenario(link="nvlink4")  # 450 GB/s / 1024 = 439 MB/s for one channel: 8.8x the 50 MB/s budget
    assert s.kv_layout.channels == 1
    assert s.effective_dilation == pytest.approx(8.8)
    assert s.scaled_link.bandwidth_Bps <= HOST_BUDGET_BPS
    assert s.scaled_link.latency_s == pytest.approx(5e-6 * 8.8)
    assert s.wall_s(1.0) == pytest.approx(8.8) and s.model_s(8.8) == pytest.approx(1.0)


def test_auto_channels_direct():
    model, link = model_by_name("llama3-8b"), link_by_name("eth-25g")
    assert auto_channels_and_dilation(model, link, 2.0, 200e6) == (128, 2.0)  # twice the dilation, twice the room
    with pytest.raises(ConfigError):
        scaled_layout(model, 0)


def test_dilation_divides_link_rate_and_stretches_latency():
    s = Scenario(scale=0.5, dilation=4.0)
    assert s.scaled_link.bandwidth_Bps == pytest.approx(3.125e9 * 0.5 / 4)
    assert s.scaled_link.latency_s == pytest.approx(20e-6 * 4)


def test_workload_is_the_simulators_stream():
    s = Scenario(rate=3.0, requests=5, seed=7)
    assert generate(s.workload) == generate(s.workload)
    assert s.workload.rate == 3.0 and s.workload.prompt.mean == 2048 and s.workload.seed == 7


def _parser():
    parser = argparse.ArgumentParser()
    add_scenario_args(parser)
    return parser


def test_to_argv_round_trips_through_the_shared_flags():
    original = Scenario(link="eth-100g", keep=0.25, scale=0.125, rate=7.5, requests=12, compress_at="gpu",
                        max_concurrency=3, dilation=2.0)
    assert scenario_from_args(_parser().parse_args(original.to_argv())) == original
    assert scenario_from_args(_parser().parse_args([])) == Scenario()


def test_shared_flags_reject_bad_values_through_the_scenario():
    with pytest.raises(ConfigError, match="choose from"):
        scenario_from_args(_parser().parse_args(["--link", "nope"]))


@pytest.mark.parametrize("scale", [1e-4, 5e-4, 9e-4])
def test_a_scale_below_one_kv_channel_a_layer_is_refused_naming_the_smallest_allowed(scale):
    with pytest.raises(ConfigError) as caught:
        Scenario(scale=scale)  # llama3-8b: 1024 KV channels a layer
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"scale: {scale!r}") and "smallest allowed is 0.000977" in message
    with pytest.raises(ConfigError, match="smallest allowed"):
        scenario_from_args(_parser().parse_args(["--scale", str(scale)]))


def test_the_smallest_allowed_scale_as_printed_is_one_channel():
    assert Scenario(scale=0.000977).kv_layout.channels == 1
    assert Scenario(scale=1 / 1024).kv_layout.channels == 1


def test_real_size_dilation_brings_the_full_link_within_the_host_budget():
    s = Scenario(link="eth-25g")  # 3.125 GB/s (REFERENCE §2) / 50 MB/s
    assert s.real_size_dilation == pytest.approx(62.5)
    at_real_size = Scenario(link="eth-25g", scale=1.0, dilation=s.real_size_dilation)
    assert at_real_size.scaled_link.bandwidth_Bps <= HOST_BUDGET_BPS * (1 + 1e-9)
