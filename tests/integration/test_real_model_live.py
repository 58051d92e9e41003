"""The real model reads what crossed the wire: `kvtransit up --kv-sample real --accuracy model`.

Two short loopback runs of real processes: the prefill sends the real model's own KV (SmolLM2-135M over GPL-3 and
json/decoder.py) for the first requests, the middlebox runs the codec on it, and decode's worker feeds what arrived
into the model. With codec none the KV arrives as it was sent, so the model reads it exactly (top-1 1, KL 0); with
band-keep at keep 0.25 it does not (top-1 below 1, KL above 0). Each run loads the model twice (the prefill's
worker, then decode's), about a minute a run on 2 cores.

Also: a worker that dies is an error naming it.
Skipped only when torch is not importable (the extra is not installed); CI installs the extra.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                       reason="the realkv extra is not installed (torch missing): pip install -e '.[realkv]'"),
    pytest.mark.slow,
    pytest.mark.timeout(400),
    pytest.mark.shares_host,  # what the model read and predicted, not how fast the host ran it (tests/conftest.py)
]

REAL_REQUESTS = 2
FLAGS = ["--links", "loopback", "--no-progress", "--no-figures", "--kv-sample", "real", "--accuracy", "model",
         "--real-kv-requests", str(REAL_REQUESTS), "--requests", "5", "--rate", "2", "--prompt-mean", "1024",
         "--prompt-cv", "0", "--output-mean", "16", "--output-cv", "0", "--accuracy-sample", "0"]


def _up(tmp_path, *codec_flags: str) -> tuple[dict, str]:
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "kvtransit.cli", "up", *FLAGS, *codec_flags, "--report",
                           str(report)], capture_output=True, text=True, timeout=380, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text()), done.stdout


@pytest.fixture(scope="module")
def none_run(tmp_path_factory):
    return _up(tmp_path_factory.mktemp("none"), "--codec", "none")


@pytest.fixture(scope="module")
def band_keep_run(tmp_path_factory):
    return _up(tmp_path_factory.mktemp("bandkeep"), "--codec", "freq-keep-k", "--keep", "0.25")


def test_every_real_kv_request_is_read_by_the_model_and_the_run_says_so(none_run):
    report, stdout = none_run
    block = report["accuracy"]["model"]
    assert block["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (block["requests"], block["measured"], block["pending"], block["failed"]) == (REAL_REQUESTS,
                                                                                         REAL_REQUESTS, 0, {})
    # 1,024-token prompts at scale 1/64 are 2 MiB each: 91 tokens of SmolLM2 (23,040 B a token), by bytes.
    assert {r["tokens"] for r in block["per_request"].values()} == {91}
    assert block["scored_tokens"] == REAL_REQUESTS * block["continuation_tokens"]
    assert not report["errors"] and report["requests"]["ok"] + report["requests"]["slo_miss"] == 5
    assert "model accuracy (SmolLM2-135M-Instruct.Q4_1.gguf on the KV that crossed the link" in stdout


def test_codec_none_arrives_as_sent_so_the_model_reads_it_exactly(none_run):
    block = none_run[0]["accuracy"]["model"]
    assert block["top1"] == 1.0 and block["kl"] == 0.0 and block["ppl"] == block["ppl_sent"]
    assert block["k_relative_error"] == 0.0 and block["v_relative_error"] == 0.0
    assert block["raw_mismatches"] == 0


def test_band_keep_at_a_quarter_changes_what_the_model_predicts(band_keep_run):
    block = band_keep_run[0]["accuracy"]["model"]
    assert block["measured"] == REAL_REQUESTS
    assert block["top1"] < 1.0 and block["kl"] > 0.0
    assert block["k_relative_error"] > 0.05  # a quarter of each block's coefficients kept


def test_a_worker_that_dies_is_an_error_naming_it():
    from kvtransit.agents.common.model_worker import ModelWorker
    from kvtransit.realmodel.errors import RealModelError

    async def run() -> str:
        worker = ModelWorker(nice=0, threads=1)
        await worker.start()
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)  # the test kills its own child, by its pid
        try:
            await worker.call("describe")
        except RealModelError as exc:
            return str(exc)
        finally:
            await worker.close()
        raise AssertionError("the call did not fail")

    message = asyncio.run(run())
    assert "the real model's worker (pid" in message and "is gone" in message
