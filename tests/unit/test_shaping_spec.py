"""LinkSpec and tc-style quantities: validated on construction, errors name the field and the value."""

from __future__ import annotations

import pytest

from kvtransit.shaping.errors import ShapingError
from kvtransit.shaping.spec import GilbertElliott, LinkSpec
from kvtransit.shaping.units import parse_rate, parse_size, parse_time


@pytest.mark.parametrize("text,expected", [
    ("200mbit", 25_000_000.0), ("1gbit", 125_000_000.0), ("8bit", 1.0), ("25mbps", 25e6), ("1mibit", 2**20 / 8),
])
def test_rates_parse_tc_style_with_bps_meaning_bytes(text, expected):
    assert parse_rate(text) == pytest.approx(expected)


def test_times_and_sizes_parse_tc_style():
    assert parse_time("5ms") == pytest.approx(0.005)
    assert parse_time("250us") == pytest.approx(250e-6)
    assert parse_size("64kb") == 65536


@pytest.mark.parametrize("text", ["200", "200 furlongs", "fast", ""])
def test_rate_without_a_known_unit_is_refused_naming_the_field(text):
    with pytest.raises(ShapingError, match="rate"):
        parse_rate(text)


def test_negative_rate_string_is_refused():
    with pytest.raises(ShapingError, match="must not be negative"):
        parse_rate("-5mbit", "--rate")


@pytest.mark.parametrize("field,value,message", [
    ("rate_Bps", -1.0, "rate_Bps=-1.0"),
    ("rate_Bps", 0.0, "rate_Bps=0.0"),
    ("loss_pct", 100.5, "loss_pct=100.5"),
    ("latency_s", -0.001, "latency_s=-0.001"),
    ("latency_s", 60.0, "latency_s=60.0"),
    ("distribution", "cauchy", "distribution='cauchy'"),
    ("direction", "sideways", "direction='sideways'"),
    ("mtu", 40, "mtu=40"),
])
def test_bad_fields_raise_naming_field_and_value(field, value, message):
    with pytest.raises(ShapingError) as info:
        LinkSpec(**{field: value})
    assert message in str(info.value)
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


def test_jitter_without_latency_is_refused():
    with pytest.raises(ShapingError, match="jitter_s"):
        LinkSpec(jitter_s=0.001)


def test_random_and_gilbert_elliott_loss_are_exclusive():
    with pytest.raises(ShapingError, match="not both"):
        LinkSpec(loss_pct=1.0, gilbert_elliott=GilbertElliott(p_pct=1.0))


def test_gilbert_elliott_percentages_are_checked():
    with pytest.raises(ShapingError, match=r"gilbert_elliott\.r_pct"):
        GilbertElliott(p_pct=1.0, r_pct=120.0)


def test_gilbert_elliott_mean_loss_is_the_stationary_mix():
    # pi_bad = p / (p + r) = 1 / (1 + 9) = 0.1; loss = 0.1 x 100 + 0.9 x 0 = 10 %.
    assert GilbertElliott(p_pct=1.0, r_pct=9.0).mean_loss_pct() == pytest.approx(10.0)


def test_queue_limit_below_the_mtu_is_refused():
    with pytest.raises(ShapingError, match="limit_bytes=100"):
        LinkSpec(rate_Bps=1e6, limit_bytes=100)


def test_scaled_multiplies_the_rate_and_keeps_the_latency():
    spec = LinkSpec(rate_Bps=3.125e9, latency_s=20e-6).scaled(0.004)
    assert spec.rate_Bps == pytest.approx(12.5e6)
    assert spec.latency_s == 20e-6


def test_scale_must_be_positive():
    with pytest.raises(ShapingError, match="scale=0"):
        LinkSpec(rate_Bps=1e6).scaled(0)


def test_parse_builds_from_strings():
    spec = LinkSpec.parse(rate="200mbit", latency="5ms", jitter="1ms", limit="1mb")
    assert (spec.rate_Bps, spec.latency_s, spec.jitter_s, spec.limit_bytes) == (25e6, 0.005, 0.001, 2**20)


def test_description_round_trips():
    spec = LinkSpec(rate_Bps=1e6, latency_s=0.01, jitter_s=0.002, gilbert_elliott=GilbertElliott(2.0, 30.0))
    assert LinkSpec.from_description(spec.describe()) == spec


def test_cli_presets_scale_reference_links_rate_but_not_latency():
    from kvtransit.cli.links import preset_spec

    spec = preset_spec("eth-25g", 0.004)  # docs/reference.md §2: 3.125 GB/s, 20 us
    assert spec.rate_Bps == pytest.approx(12.5e6)
    assert spec.latency_s == pytest.approx(20e-6)
    assert spec.name == "eth-25g"
