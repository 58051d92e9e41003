"""A kernel declared on a link (docs/reference.md §5, the deck's sketch): its fields, its file, its checks, its CLI."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvtransit.cli import main
from kvtransit.model.catalog.codecs import codec_declaration, parse_kernel_declaration
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import (
    MODULE_BUDGETS,
    PUBLISHED_OPS,
    WIRING_OPS,
    Action,
    KernelDeclaration,
    LinkKernel,
    Module,
    Policy,
    Verdict,
    budget_check,
    placement_check,
)
from kvtransit.model.module.kernel_file import declaration_to_mapping, load_kernel_declaration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kernels"
SKETCH_FILE = EXAMPLES / "freq-keep-half.toml"
SUM_FILE = EXAMPLES / "sum-two-streams.toml"
LOW, SIM = Module(ops_per_byte=MODULE_BUDGETS["low"]), Module(ops_per_byte=MODULE_BUDGETS["sim"])


def deck_sketch():
    """docs/reference.md §5's sketch, verbatim but for the class name's alias."""
    return LinkKernel(
        name="freq-keep-half",
        ops_per_byte=0.0,
        op_types={"fft", "gather"},
        transform_charged=False,
        precision_bits=8,
        ratio=2.0,
        placement="pluggable",
    )


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the declaration --------------------------------------------------------------------------------------

def test_the_decks_sketch_verbatim_is_accepted_and_gather_is_wiring():
    decl = deck_sketch()
    assert LinkKernel is KernelDeclaration
    assert decl.in_published_set and decl.wiring_ops == {"gather"}
    assert decl.transform == "none" and decl.charged_ops_per_byte == 0.0


def test_the_sketch_file_is_the_decks_sketch_plus_its_transform():
    assert load_kernel_declaration(SKETCH_FILE) == replace(deck_sketch(), transform="fft", transform_length=64)


def test_the_sketch_file_round_trips_through_json(tmp_path):
    decl = load_kernel_declaration(SKETCH_FILE)
    path = write(tmp_path, "k.json", json.dumps(declaration_to_mapping(decl)))
    assert load_kernel_declaration(path) == decl


def test_the_sketch_fits_the_low_budget_when_the_transform_is_free():
    result = budget_check(load_kernel_declaration(SKETCH_FILE), LOW)
    assert (result.verdict, result.action, result.charged_ops_per_byte) == (Verdict.FITS, Action.IN_TRANSIT, 0.0)


def test_the_sketch_is_transit_bound_at_the_low_budget_when_the_length_64_transform_is_charged():
    decl = replace(load_kernel_declaration(SKETCH_FILE), transform_charged=True)
    result = budget_check(decl, LOW)
    assert result.verdict is Verdict.TRANSIT_BOUND
    assert result.charged_ops_per_byte == pytest.approx(7.50)  # 1.25 × log2 64
    assert result.slowdown == pytest.approx(7.50 / 0.40)


def test_gather_costs_nothing_and_is_not_a_published_op():
    decl = KernelDeclaration("select", ratio=2.0, op_types={"gather"})
    assert "gather" in WIRING_OPS and "gather" not in PUBLISHED_OPS
    result = budget_check(decl, LOW)
    assert (result.verdict, result.charged_ops_per_byte, result.unpublished_ops) == (Verdict.FITS, 0.0, frozenset())


@pytest.mark.parametrize("op", ["comparison", "rounding", "topk"])
def test_comparison_rounding_and_topk_stay_unpublished(op):
    assert budget_check(KernelDeclaration("k", op_types={op, "gather"}), LOW).verdict is Verdict.NOT_ALLOWED


@pytest.mark.parametrize("policy", list(Policy))
def test_a_two_stream_sum_on_a_pluggable_is_refused_with_the_reason_whatever_the_policy(policy):
    decl = KernelDeclaration("sum", ratio=2.0, ops_per_byte=0.5, op_types={"float"}, streams=2)
    result = budget_check(decl, SIM, policy)
    assert (result.verdict, result.action) == (Verdict.MISPLACED, Action.REJECTED)
    assert "needs 2 streams but a pluggable sees 1 stream" in result.describe()


def test_a_two_stream_sum_on_a_switch_is_judged_on_its_arithmetic():
    decl = load_kernel_declaration(SUM_FILE)
    assert (decl.streams, decl.placement, decl.ops_per_byte) == (2, "switch", 0.5)  # docs/reference.md §5: 0.50 op/B
    assert placement_check(decl).ok
    assert budget_check(decl, SIM).verdict is Verdict.FITS
    assert budget_check(decl, LOW).slowdown == pytest.approx(0.5 / 0.4)


@pytest.mark.parametrize("transform", ["fft", "ntt"])
def test_fft_and_ntt_lengths_must_be_powers_of_two(transform):
    with pytest.raises(ConfigError, match=rf"transform_length must be a power of two for {transform}, got 48"):
        KernelDeclaration("k", op_types={transform}, transform=transform, transform_length=48)


def test_a_dct_takes_any_length_from_two_and_costs_what_the_fft_of_that_length_costs():
    assert KernelDeclaration("k", op_types={"fft"}, transform="dct", transform_length=48).transform_ops_per_byte > 0
    fft = KernelDeclaration("a", op_types={"fft"}, transform="fft", transform_length=64)
    dct = KernelDeclaration("b", op_types={"fft"}, transform="dct", transform_length=64)
    ntt = KernelDeclaration("c", op_types={"ntt"}, transform="ntt", transform_length=64)
    assert fft.transform_ops_per_byte == dct.transform_ops_per_byte == ntt.transform_ops_per_byte == 7.5
    with pytest.raises(ConfigError, match="transform_length must be an integer >= 2, got 1"):
        KernelDeclaration("k", op_types={"fft"}, transform="dct", transform_length=1)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(transform="fft"), "transform 'fft' needs transform_length N"),
        (dict(transform="none", transform_length=64), "transform_length 64 given with transform 'none'"),
        (dict(transform="wavelet", transform_length=64), r"unknown transform 'wavelet' \(choose from: none, fft"),
        (dict(op_types={"mac"}, transform="ntt", transform_length=256), "op_types must list 'ntt'"),
    ],
)
def test_a_transform_needs_its_length_and_its_op(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        KernelDeclaration("k", **kwargs)


def test_a_bare_length_still_means_an_fft():
    assert KernelDeclaration("k", op_types={"fft"}, transform_length=64).transform == "fft"


def test_the_band_keep_codec_declares_a_dct_so_any_block_stays_valid():
    decl = codec_declaration("freq-keep-k", transform_length=48)
    assert (decl.transform, decl.transform_length) == ("dct", 48)


@pytest.mark.parametrize("bits", [0, 33])
def test_precision_bits_outside_1_to_32_are_refused(bits):
    with pytest.raises(ConfigError, match=rf"precision_bits must be in 1\.\.32, got {bits}"):
        KernelDeclaration("k", precision_bits=bits)


@pytest.mark.parametrize("bits", [1, 32])
def test_precision_bits_at_the_ends_of_1_to_32_are_accepted(bits):
    assert KernelDeclaration("k", precision_bits=bits).precision_bits == bits


@pytest.mark.parametrize("streams", [0, -1, 1.5, True])
def test_streams_must_be_a_positive_integer(streams):
    with pytest.raises(ConfigError, match="streams must be an integer >= 1"):
        KernelDeclaration("k", streams=streams)


def test_lossless_with_a_ratio_above_one_and_no_data_dependent_op_is_refused():
    with pytest.raises(ConfigError, match="lossless with ratio 2 > 1 is impossible"):
        KernelDeclaration("k", ratio=2.0, op_types={"fft", "gather"}, transform_length=64, lossless=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(ratio=1.0, op_types={"fft"}, transform_length=64),  # a transform keeping every coefficient
        dict(ratio=0.5, op_types={"fft"}, transform_length=64),  # widened coefficients
        dict(ratio=2.0, op_types={"comparison"}),  # an entropy coder: its ratio is an average over data
    ],
)
def test_lossless_is_accepted_where_it_is_possible(kwargs):
    assert KernelDeclaration("k", lossless=True, **kwargs).lossless


def test_inline_text_takes_the_new_fields():
    decl = parse_kernel_declaration("name=s,ratio=2,ops_per_byte=0.5,op_types=float,streams=2,placement=switch,"
                                    "lossless=no")
    assert (decl.streams, decl.placement, decl.lossless, decl.transform) == (2, "switch", False, "none")
    ntt = parse_kernel_declaration("name=kem,op_types=ntt,transform=ntt,transform_length=256,lossless=yes")
    assert (ntt.transform, ntt.transform_length, ntt.lossless) == ("ntt", 256, True)


# --- the file ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "name,text,message",
    [
        ("k.toml", 'name = "k"\nratio = "two"\n', r"k\.toml: ratio: expected a number > 0"),
        ("k.toml", 'name = "k"\nop_types = "fft"\n',
         r"k\.toml: op_types: expected a list of op names from: comparison"),
        ("k.toml", 'name = "k"\ntransform_charged = "no"\n', r"k\.toml: transform_charged: expected true or false"),
        ("k.toml", 'name = "k"\nop_types = ["fft"]\ntransform_length = 63\n',
         r"k\.toml: kernel 'k': transform_length must be a power of two for fft, got 63"),
        ("k.toml", 'name = "k"\nplacement = "rack"\n', r"k\.toml: kernel 'k': unknown placement 'rack' \(choose from"),
        ("k.toml", 'name = "k"\nprecision_bits = 33\n', r"k\.toml: kernel 'k': precision_bits must be in 1\.\.32"),
        ("k.toml", 'ratio = 2.0\n', r"k\.toml: name: missing"),
        ("k.toml", 'name = "k"\nratio = \n', r"k\.toml: not valid TOML"),
        ("k.json", '{"name": "k", "streams": 2.5}', r"k\.json: streams: expected an integer >= 1"),
        ("k.json", '[{"name": "k"}]', r"k\.json: expected one kernel's fields as a table/object, got list"),
        ("k.json", '{"name": "k",}', r"k\.json: not valid JSON"),
        ("k.yaml", 'name: k\n', r"k\.yaml: unknown kernel file type '\.yaml' \(choose from: \.json, \.toml\)"),
    ],
)
def test_a_malformed_file_names_the_file_and_the_field(tmp_path, name, text, message):
    with pytest.raises(ConfigError, match=message):
        load_kernel_declaration(write(tmp_path, name, text))


def test_an_unknown_field_is_refused_by_name(tmp_path):
    path = write(tmp_path, "k.toml", 'name = "k"\nop_type = ["fft"]\n')
    with pytest.raises(ConfigError, match=r"k\.toml: unknown field 'op_type' \(choose from: name, ratio"):
        load_kernel_declaration(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"absent\.toml: cannot read the kernel file"):
        load_kernel_declaration(tmp_path / "absent.toml")


# --- the CLI ----------------------------------------------------------------------------------------------

def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_prints_the_free_transform_check_with_its_arithmetic(capsys):
    status, out, _ = run(capsys, "kernels", "--declare", str(SKETCH_FILE), "--budget", "low")
    assert status == 0
    assert "op set:     fft, gather -> in the published set (gather: wiring, 0 ops)" in out
    assert "fft N = 64: 1.25 × log2 64 = 1.25 × 6 = 7.50 ops/B, free (transform_charged = no) -> 0.00" in out
    assert "0.00 + 0.00 = 0.00 ops/B vs budget low 0.40 ops/B -> within" in out
    assert "placement:  ok: needs 1 stream, a pluggable sees 1 stream" in out
    assert "precision:  8 bits" in out


def test_cli_prints_the_charged_transform_over_the_budget_with_the_slowdown(capsys, tmp_path):
    text = SKETCH_FILE.read_text().replace("transform_charged = false", "transform_charged = true")
    path = write(tmp_path, "charged.toml", text)
    status, out, _ = run(capsys, "kernels", "--declare", str(path), "--budget", "low")
    assert status == 0
    assert "7.50 + 0.00 = 7.50 ops/B vs budget low 0.40 ops/B -> over: transit-bound, link slowed x18.75" in out


def test_cli_json_gives_each_declared_kernels_checks(capsys):
    status, out, _ = run(capsys, "kernels", "--json", "--budget", "0.8", "--declare", str(SUM_FILE), "--declare",
                         "name=sum,ratio=2,ops_per_byte=0.5,op_types=float,streams=2")
    assert status == 0
    data = json.loads(out)
    assert data["budget_ops_per_byte"] == 0.8
    on_switch, on_pluggable = data["kernels"][4:]
    assert on_switch["file"] == str(SUM_FILE) and on_switch["checks"]["placement"]["ok"]
    assert on_switch["checks"]["placement"]["streams_seen"] is None  # a switch sees many
    assert on_switch["verdict"] == "fits"
    assert on_pluggable["file"] is None
    assert (on_pluggable["verdict"], on_pluggable["action"]) == ("misplaced", "rejected")
    assert on_pluggable["checks"]["placement"] == {
        "placement": "pluggable", "streams_needed": 2, "streams_seen": 1, "ok": False,
        "text": "needs 2 streams but a pluggable sees 1 stream (place it on a switch)"}


@pytest.mark.parametrize(
    "argv,names",
    [
        (["--declare", "{missing}"], ["missing.toml", "cannot read the kernel file"]),
        (["--declare", "name=x,precision_bits=0"], ["precision_bits must be in 1..32, got 0"]),
        (["--budget", "-1"], ["'-1'", "low", "sim", "high"]),
    ],
)
def test_cli_bad_declarations_are_one_line_and_exit_status_2(capsys, tmp_path, argv, names):
    argv = [a.replace("{missing}", str(tmp_path / "missing.toml")) for a in argv]
    try:
        status = main(["kernels", *argv])
    except SystemExit as exit_:  # argparse's own errors exit from the parser
        status = exit_.code
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and all(name in err for name in names)
