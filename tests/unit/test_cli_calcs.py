"""`kvtransit calc`, `kernels` and `cost`: docs/reference.md tables through the CLI (text and --json), bad input."""

import json

import pytest

from kvtransit.cli import main

HANDOFF_TABLE = [  # docs/reference.md §2, as printed
    ("llama3-8b", "2,048", "268.4", "0.60", "5.38", "21.49", "85.92"),
    ("llama3-8b", "32,768", "4,295.0", "9.55", "85.91", "343.62", "1,374.41"),
    ("llama3-70b", "2,048", "671.1", "1.50", "13.43", "53.71", "214.77"),
    ("llama3-70b", "32,768", "10,737.4", "23.87", "214.76", "859.01", "3,435.99"),
]
LINK_COLUMNS = ("nvlink4", "ib-ndr", "eth-100g", "eth-25g")
KERNEL_TABLE = [  # docs/reference.md §5, as printed
    ("FFT length 8, keep a fixed band", "3.75", "0.00", "yes", "yes", "yes"),
    ("FFT length 64, keep a fixed band", "7.50", "0.00", "yes", "no", "yes"),
    ("FFT length 1024, keep a fixed band", "12.50", "0.00", "yes", "no", "yes"),
    ("Requantise BF16 to FP8 (per-block scale)", "0.00", "1.00", "no", "yes", "no"),
]


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys, *argv):
    status, out, _ = run(capsys, *argv, "--json")
    assert status == 0
    return json.loads(out)


def _table_cells(text):
    """The cells of each body row of a rich table, stripped."""
    return [tuple(c.strip() for c in line.strip("│ ").split("│")) for line in text.splitlines() if line.startswith("│")]


def test_calc_without_arguments_prints_the_reference_handoff_table(capsys):
    status, out, _ = run(capsys, "calc")
    assert status == 0
    assert _table_cells(out) == HANDOFF_TABLE


def test_calc_json_gives_the_reference_handoff_table_to_the_printed_digits(capsys):
    data = run_json(capsys, "calc")
    assert data["links"] == list(LINK_COLUMNS)
    got = [
        (r["model"], f"{r['prompt_tokens']:,}", f"{r['handoff_bytes'] / 1e6:,.1f}",
         *(f"{r['transfer_s'][link] * 1e3:,.2f}" for link in LINK_COLUMNS))
        for r in data["rows"]
    ]
    assert got == HANDOFF_TABLE


def test_calc_with_a_codec_reports_wire_bytes_fill_rate_energy_and_weight_load(capsys):
    data = run_json(capsys, "calc", "--model", "llama3-8b", "--prompt", "2048", "--link", "eth-25g",
                    "--codec", "freq-keep-k", "--keep", "0.25")
    (row,) = data["links"]
    assert row["kv_bytes"] == 268_435_456 and row["wire_bytes"] == 268_435_456 / 4
    assert row["placement"] == "module"
    assert row["transfer_s"] == pytest.approx(21e-6 + 67_108_864 / 3.125e9)
    assert row["handoffs_per_s_to_fill"] == pytest.approx(3.125e9 / 67_108_864)
    assert row["module_energy_j"] == pytest.approx((268_435_456 + 67_108_864) * 8e-12)  # encode + far-end decode
    assert f"{data['weight_load_s']:.2f}" == "0.25"


def test_calc_text_with_arguments_names_the_weight_load_time(capsys):
    status, out, _ = run(capsys, "calc", "--model", "llama3-70b", "--link", "eth-25g")
    assert status == 0
    assert "load over PCIe Gen5 x16 in 2.20 s" in out
    # 3.125e9 B/s / 671,088,640 B = 4.66 hand-offs per second fill the link.
    assert _table_cells(out) == [("eth-25g", "671.1", "671.1", "214.77", "4.7", "80.53", "0.00", "none", "wire")]


def test_calc_accepts_a_model_by_shape(capsys):
    data = run_json(capsys, "calc", "--model-shape",
                    "layers=16,d_model=2048,heads=32,kv_heads=8,d_ff=8192,vocab=128256", "--link", "nvlink4")
    assert data["links"][0]["kv_bytes"] == 2048 * 32_768


def test_kernels_text_prints_the_reference_kernel_table(capsys):
    status, out, _ = run(capsys, "kernels")
    assert status == 0
    assert [cells[:6] for cells in _table_cells(out)] == KERNEL_TABLE


def test_kernels_json_gives_the_reference_table_and_a_declared_kernels_verdict(capsys):
    data = run_json(capsys, "kernels", "--declare", "name=score,ops_per_byte=1,op_types=mac", "--budget", "low")
    rows = data["kernels"]
    got = [
        (r["kernel"], f"{r['transform_ops_per_byte']:.2f}", f"{r['other_ops_per_byte']:.2f}",
         *("yes" if r[k] else "no" for k in ("in_set", "fits_high_transform_charged", "fits_low_transform_free")))
        for r in rows[:4]
    ]
    assert got == KERNEL_TABLE
    score = rows[4]
    assert (score["kernel"], score["source"], score["verdict"]) == ("score", "declared", "transit-bound")
    assert score["slowdown"] == pytest.approx(1.0 / 0.40)
    assert rows[3]["verdict"] == "not-allowed" and rows[3]["action"] == "rejected"


def test_kernels_host_policy_moves_unpublished_kernels_to_the_host(capsys):
    data = run_json(capsys, "kernels", "--policy", "host")
    assert data["kernels"][3]["action"] == "host"


@pytest.mark.parametrize(
    "argv,step,printed",
    [
        (["--model", "llama3-8b", "--device", "h100", "--gpus", "1", "--decode-batch", "1", "--context", "2048"],
         "decode", "6.201"),
        (["--model", "llama3-8b", "--decode-batch", "64", "--context", "2048"], "decode", "12.514"),
        (["--model", "llama3-8b", "--prefill", "2048"], "prefill", "59.033"),
        (["--model", "llama3-70b", "--gpus", "4", "--decode-batch", "16", "--context-total", "36800"],
         "decode", "14.592"),
        (["--model", "llama3-70b", "--gpus", "4", "--prefill", "2048"], "prefill", "133.867"),
    ],
)
def test_cost_reproduces_the_reference_closed_form_checks(capsys, argv, step, printed):
    data = run_json(capsys, "cost", *argv)
    (record,) = data["steps"]
    assert record["step"] == step and f"{record['step_s'] * 1e3:.3f}" == printed
    status, out, _ = run(capsys, "cost", *argv)
    assert status == 0 and printed in out


@pytest.mark.parametrize(
    "argv,names",
    [
        (["calc", "--model", "gpt5"], ["'gpt5'", "llama3-8b", "smollm2-135m"]),
        (["calc", "--link", "wifi"], ["'wifi'", "eth-25g", "nvlink4"]),
        (["calc", "--codec", "zstd"], ["'zstd'", "fp8", "freq-keep-k"]),
        (["calc", "--prompt", "0"], ["--prompt must be > 0, got 0"]),
        (["calc", "--prompt", "-3"], ["--prompt must be > 0, got -3"]),
        (["calc", "--codec", "freq-keep-k", "--keep", "2"], ["keep must be in (0, 1], got 2.0"]),
        (["calc", "--codec", "fp8", "--policy", "reject"], ["needs rounding"]),
        (["calc", "--model-shape", "layers=2"], ["missing d_ff"]),
        (["cost", "--device", "tpu", "--prefill", "1"], ["'tpu'", "h100", "b200"]),
        (["cost", "--gpus", "0", "--prefill", "1"], ["number of GPUs must be a positive integer, got 0"]),
        (["cost", "--prefill", "10,-1"], ["prompt lengths must be positive integers"]),
        (["cost", "--decode-batch", "0", "--context", "10"], ["decode batch must be a positive integer, got 0"]),
        (["cost", "--decode-batch", "4"], ["--decode-batch needs --context"]),
        (["cost"], ["give --prefill"]),
        (["kernels", "--declare", "name=x,op_types=fft+sort"], ["unknown op type 'sort'", "rounding"]),
        (["kernels", "--declare", "name=x,ratio=-1"], ["ratio must be > 0, got -1.0"]),
        (["kernels", "--budget", "huge"], ["'huge'", "low", "high"]),
    ],
)
def test_bad_input_is_one_line_naming_the_value_and_exit_status_2(capsys, argv, names):
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own errors (choices, types) exit from the parser
        status = exit_.code
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    for name in names:
        assert name in err
