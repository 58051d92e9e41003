"""The run's one frozen config: validation, scale and dilation, the workload, and the shared flags."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.harness.studies.sweep.plan import Grid, parse_value
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.catalog.models import model_by_name
from kvtransit.model.cost.handoff import handoff
from kvtransit.model.errors import ConfigError
from kvtransit.model.kv_scale import HOST_BUDGET_BPS, auto_channels_and_dilation, scaled_layout
from kvtransit.model.module.budget import Module, Policy
from kvtransit.model.scenario import Scenario
from kvtransit.model.scenario_text import field_from_text
from kvtransit.model.serving.prefill_plan import BatchEntry, plan_prefill_step
from kvtransit.model.serving.workload import generate


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
        Scenario.build(**{field: value})
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
    assert layout.request_bytes(2048) == 268_435_456  # docs/reference.md §1: the 2,048-token hand-off


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
    s = Scenario(link="eth-25g")  # 3.125 GB/s (docs/reference.md §2) / 50 MB/s
    assert s.real_size_dilation == pytest.approx(62.5)
    at_real_size = Scenario(link="eth-25g", scale=1.0, dilation=s.real_size_dilation)
    assert at_real_size.scaled_link.bandwidth_Bps <= HOST_BUDGET_BPS * (1 + 1e-9)


# --- the module's unknowns as scenario fields (docs/reference.md §5)
# ---------------------------------------------------

def test_the_module_defaults_are_the_simulators_stage_with_passive_optics():
    s = Scenario()
    assert (s.module_budget, s.module_pj_per_bit, s.module_latency_us, s.transform_charged, s.precision_bits,
            s.placement) == ("sim", 1.0, 1.0, False, None, "pluggable")
    assert s.module == Module()  # 1.6 ops per line byte, 1 pJ per input bit, 1 µs (docs/reference.md §5)
    assert s.codec_declaration.charged_ops_per_byte == 0.0  # the FFT is free


def test_the_module_is_built_from_every_module_field():
    s = Scenario(module_budget="low", module_pj_per_bit=2.5, module_latency_us=3.0)
    assert (s.module.ops_per_byte, s.module.pj_per_input_bit, s.module.added_latency_s) == (
        0.40, 2.5, pytest.approx(3e-6))


@pytest.mark.parametrize("given,ops_per_byte", [("low", 0.40), ("sim", 1.6), ("high", 3.96), (0.8, 0.8), (2, 2.0),
                                                ("0.8", 0.8), ("1e1", 10.0)])
def test_module_budget_is_a_name_or_a_number_of_ops_per_byte(given, ops_per_byte):
    s = Scenario(module_budget=given)
    assert s.module.ops_per_byte == ops_per_byte
    assert s.module_budget == (given if given in ("low", "sim", "high") else ops_per_byte)


def test_the_scenario_declaration_carries_transform_precision_and_placement():
    decl = Scenario(codec="freq-keep-k", block=64, transform_charged=True, precision_bits=8,
                    placement="switch").codec_declaration
    # FFT length 64 on BF16: 1.25 · log2 64 = 7.50 ops per byte (docs/reference.md §5 kernel table).
    assert decl.charged_ops_per_byte == pytest.approx(7.50)
    assert (decl.precision_bits, decl.placement) == (8, "switch")


@pytest.mark.parametrize("field,value,expected", [
    ("module_budget", "medium", ("module_budget: unknown value 'medium' (choose from: low, sim, high or a number of "
                                "ops per byte > 0)")),
    ("module_budget", 0.0, "module_budget: expected low, sim, high or a number of ops per byte > 0, got 0.0"),
    ("module_budget", "-1", "module_budget: expected low, sim, high or a number of ops per byte > 0, got '-1'"),
    ("module_budget", True, "module_budget: expected low, sim, high"),
    ("module_pj_per_bit", -1.0, "module_pj_per_bit: must be >= 0"),
    ("module_latency_us", float("nan"), "module_latency_us: expected a number"),
    ("transform_charged", "yes", "transform_charged: expected yes or no (a bool), got 'yes'"),
    ("precision_bits", 0, "precision_bits: must be >= 1 and <= 32"),
    ("precision_bits", 33, "precision_bits: must be >= 1 and <= 32"),
    ("precision_bits", 8.5, "precision_bits: expected a whole number"),
    ("placement", "rack", "placement: unknown value 'rack' (choose from: pluggable, switch)"),
])
def test_bad_module_values_name_the_field_and_what_is_allowed(field, value, expected):
    with pytest.raises(ConfigError) as err:
        Scenario.build(**{field: value})
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_the_module_block_says_a_charged_transform_over_the_low_budget_is_transit_bound():
    terms = Scenario(codec="freq-keep-k", block=64, keep=0.5, transform_charged=True, module_budget="low").describe()[
        "module"]
    assert (terms["budget"], terms["budget_ops_per_byte"], terms["runs"], terms["transit_bound"]) == (
        "low", 0.40, "in-transit", True)
    assert terms["charged_ops_per_byte"] == pytest.approx(7.50)
    # ops / (budget × bw) over wire / bw = charged × ratio / budget = 7.5 × 2 / 0.4
    assert terms["compute_over_wire"] == pytest.approx(37.5)


@pytest.mark.parametrize("fields", [
    dict(),  # the transform free: nothing charged
    # FFT length 8: 3.75 ops/B, all coefficients kept (ratio 1): 3.75 × 1 < 3.96, the wire wins
    dict(transform_charged=True, module_budget="high", block=8, keep=1.0),
    dict(codec="none", transform_charged=True, module_budget="low"),  # no kernel in the module
    dict(compress_at="gpu", transform_charged=True, module_budget="low"),  # the kernel ran on the GPU
])
def test_the_module_block_is_not_transit_bound_when_the_wire_wins_or_the_module_runs_nothing(fields):
    assert Scenario.build(**fields).describe()["module"]["transit_bound"] is False


def test_module_fields_round_trip_through_the_shared_flags():
    original = Scenario(module_budget=0.8, module_pj_per_bit=2.5, module_latency_us=3.0, transform_charged=True,
                        precision_bits=8, placement="switch")
    assert scenario_from_args(_parser().parse_args(original.to_argv())) == original
    named = Scenario(module_budget="high", precision_bits=None, transform_charged=False)
    assert scenario_from_args(_parser().parse_args(named.to_argv())) == named


@pytest.mark.parametrize("argv,expected", [
    (["--transform-charged"], True),
    (["--transform-charged", "yes"], True),
    (["--transform-charged", "no"], False),
    (["--transform-charged", "False"], False),
    ([], False),
])
def test_transform_charged_flag_says_yes_alone_and_takes_yes_or_no(argv, expected):
    assert scenario_from_args(_parser().parse_args(argv)).transform_charged is expected


def test_module_flags_set_the_module():
    s = scenario_from_args(_parser().parse_args(
        ["--module-budget", "low", "--module-pj-per-bit", "0.5", "--module-latency-us", "2", "--precision-bits", "8",
         "--placement", "switch"]))
    assert (s.module.ops_per_byte, s.module.pj_per_input_bit, s.module.added_latency_s) == (
        0.40, 0.5, pytest.approx(2e-6))
    assert (s.precision_bits, s.placement) == (8, "switch")
    assert scenario_from_args(_parser().parse_args(["--module-budget", "0.7"])).module.ops_per_byte == 0.7
    assert scenario_from_args(_parser().parse_args(["--precision-bits", "none"])).precision_bits is None


@pytest.mark.parametrize("argv,expected", [
    (["--transform-charged", "maybe"], ("kvtransit up: error: argument --transform-charged: expected yes or no, "
                                       "got 'maybe'")),
    (["--precision-bits", "eight"], ("kvtransit up: error: argument --precision-bits: expected a whole number of "
                                    "bits in 1..32 or 'none', got 'eight'")),
    (["--module-pj-per-bit", "lots"], ("kvtransit up: error: argument --module-pj-per-bit: expected a number, "
                                      "got 'lots'")),
    (["--module-latency-us", "1ms"], ("kvtransit up: error: argument --module-latency-us: expected a number, "
                                     "got '1ms'")),
])
def test_a_module_flag_of_the_wrong_type_is_one_line_naming_the_flag(argv, expected, capsys):
    from kvtransit.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["up", *argv])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected]


@pytest.mark.parametrize("argv,expected", [
    (["--module-budget", "medium"], ("module_budget: unknown value 'medium' (choose from: low, sim, high or a number "
                                    "of ops per byte > 0)")),
    (["--precision-bits", "40"], "precision_bits: must be >= 1 and <= 32, got 40"),
    (["--placement", "rack"], "placement: unknown value 'rack' (choose from: pluggable, switch)"),
])
def test_a_module_flag_out_of_range_is_refused_by_the_scenario_in_one_line(argv, expected):
    with pytest.raises(ConfigError) as err:
        scenario_from_args(_parser().parse_args(argv))
    assert str(err.value) == expected


def test_every_process_takes_the_module_flags():
    from kvtransit.cli import build_parser

    argv = Scenario(transform_charged=True, module_budget="low", precision_bits=8).to_argv()
    for role, required in (("up", []), ("middlebox", ["--decode", "x:1"]), ("prefill", ["--kv-to", "x:1"]),
                           ("decode", []), ("loadgen", ["--prefill", "x:1", "--decode-clients", "x:1"])):
        args = build_parser().parse_args([role, *argv, *required])
        assert (args.scenario_transform_charged, args.scenario_module_budget, args.scenario_precision_bits) == (
            True, "low", 8), role


@pytest.mark.parametrize("name,text,value", [
    ("transform_charged", "true", True), ("transform_charged", "NO", False), ("precision_bits", "None", None),
    ("precision_bits", "8", 8), ("module_budget", "0.8", "0.8"), ("module_pj_per_bit", "2", 2.0),
    ("scale", "auto", "auto"), ("rate", "7.5", 7.5), ("requests", "12", 12), ("link", "eth-100g", "eth-100g"),
])
def test_field_text_is_read_as_the_field_is_typed(name, text, value):
    assert field_from_text(name, text) == value


def test_sweeping_module_pj_per_bit_changes_the_module_energy_only():
    """A grid over module_pj_per_bit (as `kvtransit sweep --grid module_pj_per_bit=...` builds it): the module's
    energy (input bits × pJ) scales with it; the link's (wire bits × link pJ) and the GPU's do not."""
    grid = Grid({"codec": "freq-keep-k"}, {"module_pj_per_bit": [parse_value("module_pj_per_bit", v)
                                                                 for v in ("0.5", "1", "4")]})
    energies = []
    for point in grid.points():
        s = grid.scenario(point)
        est = handoff(s.model_spec, 2048, s.link_spec, s.codec_declaration, s.module, Policy(s.policy))
        gpu_j = plan_prefill_step(s, [BatchEntry("r", 2048, 32)]).energy_j
        energies.append((s.module_pj_per_bit, est.module_energy_j, est.link_energy_j, gpu_j))
    kv_bits = 8 * model_by_name("llama3-8b").kv_bytes(2048)
    wire_bits = kv_bits / grid.scenario(next(iter(grid.points()))).codec_declaration.ratio
    for pj, module_j, _link_j, _gpu_j in energies:
        # docs/reference.md §5: input bits × pJ per input bit, at the encoding module and the far end's decoding one
        assert module_j == pytest.approx((kv_bits + wire_bits) * pj * 1e-12)
    assert len({link_j for _, _, link_j, _ in energies}) == 1
    assert len({gpu_j for _, _, _, gpu_j in energies}) == 1
