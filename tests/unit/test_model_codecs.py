"""Codec presets, the kernel table of docs/reference.md §5 and the hand-off calculator (docs/reference.md §2, §5)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtransit.model.catalog.codecs import (
    CODECS,
    KERNEL_TABLE_ROWS,
    codec_declaration,
    kernel_table_row,
    parse_kernel_declaration,
)
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.cost.handoff import handoff
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import KernelDeclaration, Module, Policy, Verdict

L8B = MODELS["llama3-8b"]


def test_codec_preset_ratios_of_reference_section_5():
    assert {name: decl.ratio for name, decl in CODECS.items()} == pytest.approx(
        {"none": 1.0, "fp8": 2.0, "fp4-block": 64 / 17, "freq-keep-k": 2.0, "kivi-2": 16 / 3, "kivi-3": 4.0})
    assert f"{CODECS['fp4-block'].ratio:.3f}" == "3.765"


def test_quantising_codecs_need_rounding_and_the_band_keep_does_not():
    assert "rounding" in CODECS["fp8"].op_types and "rounding" in CODECS["fp4-block"].op_types
    assert CODECS["freq-keep-k"].in_published_set
    assert CODECS["freq-keep-k"].charged_ops_per_byte == 0.0  # passive optics: the FFT is free


def test_freq_keep_k_ratio_is_one_over_keep():
    assert codec_declaration("freq-keep-k", keep=0.25).ratio == pytest.approx(4.0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(name="zstd"),
         r"unknown codec 'zstd' \(choose from: fp4-block, fp8, freq-keep-k, kivi-2, kivi-3, none\)"),
        (dict(name="freq-keep-k", keep=0), r"keep must be in \(0, 1\]"),
        (dict(name="freq-keep-k", keep=1.5), r"keep must be in \(0, 1\]"),
        (dict(name="fp4-block", block=7), "fp4 block must be an even integer"),
    ],
)
def test_bad_codec_choices_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        codec_declaration(**kwargs)


def test_kernel_table_of_reference_section_5_to_the_printed_digits():
    def printed(row):
        yn = lambda flag: "yes" if flag else "no"  # noqa: E731
        return (f"{row.transform_ops_per_byte:.2f}", f"{row.other_ops_per_byte:.2f}", yn(row.in_set),
                yn(row.fits_high_transform_charged), yn(row.fits_low_transform_free))

    assert [printed(kernel_table_row(d)) for d in KERNEL_TABLE_ROWS] == [
        ("3.75", "0.00", "yes", "yes", "yes"),
        ("7.50", "0.00", "yes", "no", "yes"),
        ("12.50", "0.00", "yes", "no", "yes"),
        ("0.00", "1.00", "no", "yes", "no"),
    ]


def test_declaration_text_round_trips_every_field():
    decl = parse_kernel_declaration(
        "name=score,ratio=4,ops_per_byte=1.0,op_types=mac+fft,transform_charged=no,transform_length=64,"
        "precision_bits=8,placement=switch")
    assert (decl.name, decl.ratio, decl.ops_per_byte, decl.op_types) == ("score", 4.0, 1.0, {"mac", "fft"})
    assert (decl.transform_charged, decl.transform_length, decl.precision_bits, decl.placement) == (
        False, 64, 8, "switch")


@pytest.mark.parametrize(
    "text,message",
    [
        ("ratio=2", "missing name"),
        ("name=x,speed=3", "unknown key 'speed'"),
        ("name=x,ratio=fast", "ratio must be a number"),
        ("name=x,ratio=0", "ratio must be > 0"),
        ("name=x,transform_charged=maybe", "transform_charged must be yes or no"),
        ("name=x,op_types=fft+sort", "unknown op type 'sort'"),
        ("name=x,placement=rack", "unknown placement 'rack'"),
        ("name=x,ratio", "expected key=value"),
    ],
)
def test_bad_declaration_text_names_what_is_wrong(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_kernel_declaration(text)


def test_bare_handoff_is_latency_plus_bytes_over_bandwidth():
    est = handoff(L8B, 2048, LINKS["eth-25g"])
    assert est.placement == "none" and est.budget is None
    assert est.transfer_s == pytest.approx(20e-6 + 268_435_456 / 3.125e9)
    assert f"{est.handoffs_per_s_to_fill:.1f}" == "11.6"  # docs/reference.md §2
    assert est.link_energy_j == pytest.approx(268_435_456 * 8 * 15e-12)
    assert est.module_energy_j == 0.0


def test_band_keep_in_transit_halves_the_wire_and_pays_the_module_latency_and_energy():
    est = handoff(L8B, 2048, LINKS["eth-25g"], CODECS["freq-keep-k"])
    assert est.placement == "module" and est.budget.verdict is Verdict.FITS
    assert est.wire_bytes == 268_435_456 / 2
    assert est.transfer_s == pytest.approx(20e-6 + 1e-6 + 134_217_728 / 3.125e9)
    # input bits × 1 pJ (docs/reference.md §5's stage) + the far end's decoding module on the wire bits
    assert est.module_energy_j == pytest.approx((268_435_456 + 134_217_728) * 8 * 1e-12)


def test_a_charged_kernel_over_budget_makes_the_handoff_transit_bound():
    heavy = KernelDeclaration(
        "fft1024-charged", ratio=2.0, op_types={"fft"}, transform_length=1024, transform_charged=True)
    est = handoff(L8B, 2048, LINKS["eth-25g"], heavy, Module())
    assert est.transit_bound
    assert est.occupancy_s == pytest.approx(268_435_456 * 12.5 / (1.6 * 3.125e9))


def test_unpublished_codec_runs_on_host_or_is_rejected_by_policy():
    on_host = handoff(L8B, 2048, LINKS["eth-25g"], CODECS["fp8"], policy=Policy.HOST)
    assert on_host.placement == "host" and on_host.module_energy_j == 0.0
    assert on_host.transfer_s == pytest.approx(20e-6 + 134_217_728 / 3.125e9)
    with pytest.raises(ConfigError, match="codec 'fp8' needs rounding"):
        handoff(L8B, 2048, LINKS["eth-25g"], CODECS["fp8"], policy=Policy.REJECT)


@given(a=st.integers(1, 200_000), b=st.integers(1, 200_000), link=st.sampled_from(sorted(LINKS)),
       codec=st.sampled_from(sorted(CODECS)))
def test_handoff_time_never_falls_as_the_prompt_grows(a, b, link, codec):
    small, large = sorted((a, b))
    assert handoff(L8B, small, LINKS[link], CODECS[codec]).transfer_s <= handoff(
        L8B, large, LINKS[link], CODECS[codec]).transfer_s
