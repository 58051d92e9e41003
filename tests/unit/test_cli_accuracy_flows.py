"""`kvtransit accuracy --select / --ring`: tables on the committed real-KV sample, bad input in one line."""

from __future__ import annotations

import json

from kvtransit.cli import main

SMALL = ["--layers", "1", "--needle-contexts", "1024", "--needle-trials", "2", "--score-bits", "8,full",
         "--no-progress"]


def test_select_reports_recall_and_output_error_for_every_budget_kind_and_precision(capsys):
    assert main(["accuracy", "--select", *SMALL, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sel = out["selection"]
    assert out["kv"].endswith("smollm2_kv_sample.npz")
    assert set(sel["texts"]) == {"prose", "code"}
    rows = sel["texts"]["prose"]
    assert len(rows) == 2 * 2 * 3 * 2  # kinds × sink page kept or not × budgets × precisions
    assert {(r["kind"], r["budget"], r["precision_bits"]) for r in rows} >= {("mean", 1 / 16, 8),
                                                                               ("minmax", 1 / 4, None)}
    assert all(0 <= r["recall"] <= 1 and r["output_error"] >= 0 for r in rows)
    # A larger budget keeps more of the attention mass.
    full_mean = {r["budget"]: r["recall"] for r in rows if r["kind"] == "mean" and r["precision_bits"] is None
                 and r["sink_pages"] == 0}
    assert full_mean[1 / 4] > full_mean[1 / 8] > full_mean[1 / 16]
    assert {n["context"] for n in sel["needle"]} == {1024}


def test_ring_is_exact_without_a_codec_and_reports_error_per_hop(capsys, tmp_path):
    page = tmp_path / "ring.md"
    assert main(["accuracy", "--ring", "--layers", "1", "--ring-sizes", "2,4", "--ring-codecs", "fp8",
                 "--no-progress", "--markdown", str(page)]) == 0
    printed = capsys.readouterr().out
    assert "ring attention, a codec once per hop" in printed
    text = page.read_text()
    assert "kvtransit accuracy --ring --layers 1 --ring-sizes 2,4 --ring-codecs fp8" in text
    assert "tests/data/smollm2_kv_sample.npz" in text  # each table says what KV it ran on


def test_ring_json_has_n_minus_one_hops_and_errors_after_each(capsys):
    assert main(["accuracy", "--ring", "--synthetic", "gaussian", "--layers", "1", "--ring-sizes", "4",
                 "--ring-codecs", "fp8", "--no-progress", "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["ring"]["texts"]["gaussian"]
    assert text["exact"][0]["hops_per_layer"] == "3" and float(text["exact"][0]["rel_err"]) < 1e-12
    assert len(text["codecs"][0]["after_hops"]) == 3


def test_bad_selection_input_is_one_line_with_the_valid_values(capsys):
    assert main(["accuracy", "--select", "--page-budgets", "0", "--no-progress"]) == 2
    assert "page budget must be a fraction in (0, 1]" in capsys.readouterr().err
    assert main(["accuracy", "--select", "--page-size", "100", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "page size 100 does not divide the context's 384 tokens (valid page sizes: 1, 2, 3" in err
    assert main(["accuracy", "--ring", "--ring-codecs", "zip", "--no-progress"]) == 2
    assert "unknown codec 'zip'" in capsys.readouterr().err
    assert main(["accuracy", "--select", "--end-to-end"]) == 2
