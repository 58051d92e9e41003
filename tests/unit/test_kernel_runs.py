"""A declared kernel runs live: the one implementation each shape maps onto, every refusal with its
reason, and `--kernel FILE` on the scenario flags (conflicts named, the children given the mapped flags)."""

import argparse
import re
from pathlib import Path

import pytest

from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args
from kvtransit.kernels import quant
from kvtransit.kernels.bandkeep import kept_count
from kvtransit.kernels.registry import get_codec
from kvtransit.model.catalog.codecs import CODECS
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import KernelDeclaration, LinkKernel
from kvtransit.model.module.kernel_runs import LIVE_FP4_BLOCK, RUNNABLE_SHAPES, scenario_fields_for
from kvtransit.model.scenario import Scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kernels"
SKETCH_FILE = EXAMPLES / "freq-keep-half.toml"
CHARGED_FILE = EXAMPLES / "band-keep-64-charged.toml"
SUM_FILE = EXAMPLES / "sum-two-streams.toml"


def band_keep(**changes) -> KernelDeclaration:
    fields = dict(name="bk", transform="dct", transform_length=64, op_types={"fft", "gather"}, ratio=2.0,
                  transform_charged=False)
    return KernelDeclaration(**{**fields, **changes})


def rounding(ratio: float, **changes) -> KernelDeclaration:
    fields = dict(name="rq", ratio=ratio, op_types={"rounding"}, ops_per_byte=0.5)
    return KernelDeclaration(**{**fields, **changes})


def _parse(argv: list[str]) -> Scenario:
    parser = argparse.ArgumentParser()
    add_scenario_args(parser)
    return scenario_from_args(parser.parse_args(argv))


# --- the runnable shapes -------------------------------------------------------------------------------------

def test_the_decks_sketch_maps_to_fft_band_keep_keeping_half_with_8_bit_precision():
    sketch = LinkKernel(name="freq-keep-half", ops_per_byte=0.0, op_types={"fft", "gather"}, transform_charged=False,
                        precision_bits=8, ratio=2.0, placement="pluggable", transform="fft", transform_length=64)
    assert scenario_fields_for(sketch) == {
        "codec": "freq-keep-k", "variant": "fft", "block": 64, "keep": 0.5, "compress_at": "transit",
        "transform_charged": False, "precision_bits": 8, "placement": "pluggable"}


@pytest.mark.parametrize("transform,n,ratio,kept", [
    *((t, 64, r, k) for t in ("dct", "fft") for r, k in ((2.0, 32), (4.0, 16), (64 / 3, 3), (64 / 63, 63))),
    ("fft", 8, 8.0, 1), ("dct", 48, 1.6, 30),  # a DCT takes any length; an FFT's is a power of two
])
def test_band_keep_keeps_the_whole_number_of_coefficients_the_ratio_says(transform, n, ratio, kept):
    fields = scenario_fields_for(band_keep(transform=transform, transform_length=n, ratio=ratio))
    assert (fields["codec"], fields["variant"], fields["block"]) == ("freq-keep-k", transform, n)
    assert kept_count(n, fields["keep"]) == kept  # what the live codec then keeps a block
    assert Scenario.build(**fields).codec_declaration.ratio == pytest.approx(ratio)


def test_the_mapped_band_keep_is_what_the_live_codec_builds():
    fields = scenario_fields_for(band_keep(transform="fft", ratio=4.0, precision_bits=6))
    codec = get_codec(fields["codec"], keep=fields["keep"], block=fields["block"], variant=fields["variant"],
                      precision_bits=fields["precision_bits"])
    assert codec.params["precision_bits"] == 6 and codec.declaration.ratio == 4.0


@pytest.mark.parametrize("ratio", [2.0, 2.004, 1.995])
def test_rounding_at_ratio_2_runs_fp8(ratio):
    assert scenario_fields_for(rounding(ratio))["codec"] == "fp8"


@pytest.mark.parametrize("ratio", [64 / 17, 3.765, 3.76, 3.77])
def test_rounding_at_ratio_64_over_17_runs_fp4_block_on_the_live_codecs_block(ratio):
    fields = scenario_fields_for(rounding(ratio, ops_per_byte=1.0))
    assert (fields["codec"], fields["block"]) == ("fp4-block", LIVE_FP4_BLOCK)
    assert LIVE_FP4_BLOCK == quant.FP4_BLOCK
    get_codec("fp4-block", block=fields["block"])  # the block the middlebox passes is one it accepts


@pytest.mark.parametrize("ratio,codec", [(4.0, "kivi-3"), (16 / 3, "kivi-2"), (5.33, "kivi-2")])
def test_rounding_and_comparison_at_the_kivi_ratios_run_kivi(ratio, codec):
    fields = scenario_fields_for(rounding(ratio, op_types={"rounding", "comparison"}, ops_per_byte=2.5))
    assert fields["codec"] == codec
    assert get_codec(codec).declaration.ratio == pytest.approx(ratio, rel=5e-3)


def test_a_kivi_ratio_without_comparison_is_refused():
    with pytest.raises(ConfigError, match="lack comparison, which kivi-3 runs on"):
        scenario_fields_for(rounding(4.0, ops_per_byte=2.5))


def test_a_ratio_outside_the_presets_tolerance_matches_no_requantiser():
    with pytest.raises(ConfigError, match=r"transform none with ratio 3.7 matches no implementation"):
        scenario_fields_for(rounding(3.7, ops_per_byte=1.0))


def test_ratio_1_with_no_ops_runs_codec_none_and_may_say_lossless():
    fields = scenario_fields_for(KernelDeclaration(name="pass", lossless=True))
    assert fields["codec"] == "none" and fields["compress_at"] == "transit"


def test_the_unknowns_become_the_same_named_scenario_fields():
    fields = scenario_fields_for(band_keep(transform_charged=True, precision_bits=10, placement="switch"))
    assert (fields["transform_charged"], fields["precision_bits"], fields["placement"]) == (True, 10, "switch")
    assert "sinks" not in fields  # a declaration has no sinks: the scenario's (docs/reference.md §6: 4) stay


def test_a_published_op_beyond_what_runs_is_accepted_at_the_same_cost():
    assert scenario_fields_for(band_keep(op_types={"fft", "gather", "mac"}))["codec"] == "freq-keep-k"
    assert scenario_fields_for(rounding(2.0, op_types={"rounding", "comparison"}))["codec"] == "fp8"


def test_the_kernel_tables_requantise_row_runs_as_fp8_its_ops_never_charged_in_the_module():
    # docs/reference.md §5's table prices requantise at 1.00 op/B, the fp8 preset at 0.50: the op needs rounding, so the
    # module refuses it or the host runs it, and neither charges ops.
    assert scenario_fields_for(rounding(2.0, ops_per_byte=1.0))["codec"] == "fp8"


# --- refusals, each with its reason ----------------------------------------------------------------------------

@pytest.mark.parametrize("ratio,kept", [(3.0, "21.33"), (5.0, "12.8")])
def test_a_ratio_that_contradicts_the_kept_fraction_is_refused_with_the_nearest_that_do_not(ratio, kept):
    with pytest.raises(ConfigError) as err:
        scenario_fields_for(band_keep(ratio=ratio))
    message = str(err.value)
    assert f"ratio {ratio:g} contradicts the transform's kept fraction" in message
    assert f"{kept} of 64 coefficients" in message and "nearest:" in message


def test_the_nearest_ratios_offered_are_themselves_runnable():
    with pytest.raises(ConfigError) as err:
        scenario_fields_for(band_keep(ratio=3.0))
    for offered in re.findall(r"([\d.]+) \(keeps \d+\)", str(err.value)):
        scenario_fields_for(band_keep(ratio=64 / round(64 / float(offered))))


@pytest.mark.parametrize("ratio,what", [(1.0, "drops nothing"), (0.5, "widens the block")])
def test_a_band_keep_that_keeps_every_coefficient_or_more_is_refused(ratio, what):
    with pytest.raises(ConfigError, match=what):
        scenario_fields_for(band_keep(ratio=ratio))


def test_an_ntt_is_refused_for_the_kv_hand_off_with_the_runnable_shapes():
    ntt = KernelDeclaration(name="ml-kem", transform="ntt", transform_length=256, op_types={"ntt", "modular"})
    with pytest.raises(ConfigError) as err:
        scenario_fields_for(ntt)
    message = str(err.value)
    assert "an NTT" in message and "ciphertext and collective flows" in message
    assert message.endswith(RUNNABLE_SHAPES)


def test_a_sum_of_streams_is_refused_for_the_kv_hand_off():
    total = KernelDeclaration(name="sum", ops_per_byte=0.5, op_types={"float"}, streams=2, placement="switch")
    with pytest.raises(ConfigError, match=r"combines 2 streams .*ciphertext and collective flows"):
        scenario_fields_for(total)


def test_an_fp8_declared_without_rounding_is_refused_naming_the_missing_op():
    with pytest.raises(ConfigError, match=r"op_types \[\] lack rounding, which fp8 runs on"):
        scenario_fields_for(rounding(2.0, op_types=set()))


def test_fewer_ops_per_byte_than_the_implementation_needs_is_refused():
    with pytest.raises(ConfigError, match=r"ops_per_byte 0.25 is fewer than fp8 needs: 0.5 ops/B"):
        scenario_fields_for(rounding(2.0, ops_per_byte=0.25))


def test_more_ops_per_byte_than_an_in_module_kernel_runs_is_refused():
    with pytest.raises(ConfigError, match=r"ops_per_byte 0.5 is more than freq-keep-k runs .*declare 0"):
        scenario_fields_for(band_keep(ops_per_byte=0.5))


def test_an_unpublished_op_a_band_keep_does_not_run_is_refused():
    with pytest.raises(ConfigError, match=r"op_types add rounding \(not published\), which freq-keep-k does not run"):
        scenario_fields_for(band_keep(op_types={"fft", "rounding"}))


def test_a_rounding_op_on_a_pass_through_is_refused():
    with pytest.raises(ConfigError, match=r"op_types add rounding .* which none does not run"):
        scenario_fields_for(KernelDeclaration(name="x", op_types={"rounding"}))


def test_a_lossless_requantiser_is_refused():
    with pytest.raises(ConfigError, match=r"declared lossless, but fp8 rounds"):
        scenario_fields_for(rounding(2.0, op_types={"rounding", "comparison"}, lossless=True))


# --- the example files ---------------------------------------------------------------------------------------

def test_the_charged_example_runs_transit_bound_at_every_named_budget():
    for budget in ("low", "sim", "high"):
        scenario = _parse(["--kernel", str(CHARGED_FILE), "--module-budget", budget])
        terms = scenario.module_terms()
        assert (terms["runs"], terms["verdict"], terms["transit_bound"]) == ("in-transit", "transit-bound", True)
        assert terms["charged_ops_per_byte"] == 7.5


def test_the_sum_example_is_refused_by_kernel_with_the_file_named():
    with pytest.raises(ConfigError, match=rf"^--kernel {re.escape(str(SUM_FILE))}: kernel 'sum-two-streams': "):
        _parse(["--kernel", str(SUM_FILE)])


# --- --kernel on the scenario flags ----------------------------------------------------------------------------

def test_kernel_sets_the_mapped_fields_and_records_the_file():
    scenario = _parse(["--kernel", str(SKETCH_FILE)])
    assert (scenario.codec, scenario.variant, scenario.block, scenario.keep, scenario.precision_bits) == (
        "freq-keep-k", "fft", 64, 0.5, 8)
    assert scenario.kernel_file == str(SKETCH_FILE)
    assert scenario.describe()["kernel_file"] == str(SKETCH_FILE)  # the report's config says what was run


def test_the_children_get_the_mapped_flags_not_the_file():
    scenario = _parse(["--kernel", str(SKETCH_FILE), "--rate", "3"])
    argv = scenario.to_argv()
    assert "--kernel" not in argv  # what the launcher passes every process (harness/up/launcher.py: to_argv)
    assert argv[argv.index("--variant") + 1] == "fft" and argv[argv.index("--precision-bits") + 1] == "8"
    assert _parse(argv) == scenario  # a child reads back the same scenario without the file


def test_a_flag_that_contradicts_the_kernel_is_an_error_naming_both():
    with pytest.raises(ConfigError, match=rf"^--kernel {re.escape(str(SKETCH_FILE))} sets --codec freq-keep-k, "
                                          r"but --codec fp8 was given too: drop one$"):
        _parse(["--kernel", str(SKETCH_FILE), "--codec", "fp8"])


def test_a_flag_given_at_its_default_still_contradicts_the_kernel():
    # --variant dct is the field's default: given on the command line, it says otherwise than the file (fft).
    with pytest.raises(ConfigError, match=r"sets --variant fft, but --variant dct was given too"):
        _parse(["--kernel", str(SKETCH_FILE), "--variant", "dct"])


@pytest.mark.parametrize("argv", [["--precision-bits", "none"], ["--compress-at", "gpu"],
                                  ["--transform-charged"], ["--kernel-file", "other.toml"]])
def test_each_mapped_field_is_guarded(argv):
    with pytest.raises(ConfigError, match=r"was given too: drop one"):
        _parse(["--kernel", str(SKETCH_FILE), *argv])


def test_flags_that_agree_with_the_kernel_or_that_it_leaves_alone_are_taken():
    scenario = _parse(["--kernel", str(SKETCH_FILE), "--codec", "freq-keep-k", "--keep", "0.5", "--sinks", "0",
                       "--module-budget", "low", "--policy", "host"])
    assert (scenario.sinks, scenario.module_budget, scenario.policy) == (0, "low", "host")


def test_without_kernel_the_flags_are_the_fields_defaults():
    assert _parse([]) == Scenario()
    assert _parse(["--codec", "none"]).codec == "none"


def test_a_missing_kernel_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(missing))}: cannot read the kernel file"):
        _parse(["--kernel", str(missing)])


def test_a_json_kernel_file_runs_like_toml(tmp_path):
    path = tmp_path / "fp4.json"
    path.write_text('{"name": "mxfp4", "ratio": 3.765, "ops_per_byte": 1.0, "op_types": ["rounding"]}')
    scenario = _parse(["--kernel", str(path), "--policy", "host"])
    assert (scenario.codec, scenario.block) == ("fp4-block", 32)
    assert CODECS["fp4-block"].ratio == pytest.approx(3.765, abs=5e-4)


def test_a_sweep_grid_over_a_field_the_kernel_file_sets_is_refused_naming_both(tmp_path, capsys):
    from kvtransit.cli import main

    code = main(["sweep", "--out", str(tmp_path / "s"), "--kernel", str(SKETCH_FILE), "--grid", "codec=none,fp8"])
    assert code != 0
    err = capsys.readouterr().err
    assert "--grid codec=... varies a field --kernel" in err and "freq-keep-half.toml" in err
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())  # nothing ran
