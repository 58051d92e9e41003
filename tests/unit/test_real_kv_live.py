"""`--kv-sample real` without the model: which requests carry the real model's KV and how many of
its tokens, what the prefill sends for them, how the report pools decode's readings, and the scenario's rules.
The model itself reads the KV in tests/integration/test_real_model_live.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from ml_dtypes import bfloat16

from kvtransit.agents.prefill.agent import PrefillAgent
from kvtransit.agents.prefill.real_kv import RealKv
from kvtransit.agents.process import Address
from kvtransit.kernels.chunk_rows import decoded_layers
from kvtransit.model.errors import ConfigError
from kvtransit.model.kv_scale import KvLayout
from kvtransit.model.scenario import Scenario
from kvtransit.realmodel import live
from kvtransit.report.model_accuracy import model_accuracy_block, model_accuracy_errors
from kvtransit.report.text import model_accuracy_line
from kvtransit.runtime.clock import ManualClock
from kvtransit.wire.events import Request

ANY = Address("127.0.0.1", 0)
SMOLLM2 = KvLayout(30, 3, 64)  # SmolLM2-135M: what the worker's `describe` says (23,040 B a token in BF16)


def test_a_request_carries_as_many_real_tokens_as_its_own_kv_bytes_at_the_runs_scale():
    scenario = Scenario(kv_sample="real")  # llama3-8b on eth-25g, scale auto: 1/64, 2,048 B a token
    assert scenario.kv_layout.bytes_per_token == 2048
    carried = live.real_tokens(scenario.kv_layout.request_bytes(2048), SMOLLM2.bytes_per_token)
    assert carried == live.RealTokens(182, 182) and not carried.capped  # 4 MiB / 23,040 B
    assert abs(carried.tokens * SMOLLM2.bytes_per_token / scenario.kv_layout.request_bytes(2048) - 1) < 0.005


def test_real_tokens_are_held_within_the_windows_and_a_capped_request_says_so():
    assert live.real_tokens(10 * 23040, 23040) == live.RealTokens(live.MIN_TOKENS, 10)
    big = live.real_tokens(10_000 * 23040, 23040)
    assert big.tokens == live.CONTEXT_MAX and big.wanted == 10_000 and big.capped
    with pytest.raises(ValueError, match="real_bytes_per_token"):
        live.real_tokens(100, 0)


def test_requests_cycle_through_the_live_windows_each_long_enough_for_its_continuation():
    windows = live.live_windows()
    assert [live.window_for(rid) for rid in range(2 * len(windows))] == windows * 2
    assert all(w.context == live.CONTEXT_MAX and w.continuation == live.CONTINUATION for w in windows)


def test_only_the_first_requests_carry_real_kv_and_only_with_kv_sample_real():
    real = Scenario(kv_sample="real", real_kv_requests=3)
    assert [rid for rid in range(10) if real.carries_real_kv(rid)] == [0, 1, 2]
    assert not Scenario().carries_real_kv(0)
    assert real.kv_sample_path is None  # the other requests' KV stays synthetic


@pytest.mark.parametrize("fields, message", [
    ({"accuracy": "model"}, "accuracy: 'model' needs kv_sample 'real'"),
    ({"kv_sample": "real", "prefill_chunk": 1024}, "does not combine with prefill_chunk"),
    ({"accuracy": "perplexity"}, "accuracy"),
    ({"kv_sample": "real", "real_kv_requests": 0}, "real_kv_requests"),
])
def test_the_scenario_refuses_real_kv_settings_that_cannot_run(fields, message):
    with pytest.raises(ConfigError, match=message):
        Scenario.build(**fields)


def _prefill_with_real_rows(scenario: Scenario) -> tuple[PrefillAgent, list[np.ndarray]]:
    """A prefill whose RealKv holds rows as the worker would hand them back (window 0's, seeded numbers in place of
    the model's: what is tested is how they are cut and framed, not what they are)."""
    agent = PrefillAgent(scenario, name="prefill-test", listen=ANY, kv_to=ANY, metrics_listen=ANY,
                         clock=ManualClock(0))
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((6, live.CONTEXT_MAX, 64)).astype(bfloat16) for _ in range(SMOLLM2.layers)]
    real_kv = real_kv_of(agent)
    real_kv.layout = SMOLLM2
    real_kv.model = {"name": "SmolLM2-test"}
    real_kv._rows = {live.window_for(0).name: rows}
    return agent, rows


def real_kv_of(agent: PrefillAgent) -> RealKv:
    return next(part for part in agent.parts if isinstance(part, RealKv))


def test_the_prefill_sends_a_real_kv_requests_first_tokens_of_its_window_and_keeps_its_prompt_length():
    scenario = Scenario(kv_sample="real", real_kv_requests=1, codec="none")
    agent, rows = _prefill_with_real_rows(scenario)
    begin, frames = agent.stager.make_frames(Request(request_id=0, prompt_tokens=2048, output_tokens=8, sent_ns=0), 123)
    assert begin.prompt_tokens == 2048  # decode batches and reserves the request's own prompt
    assert (begin.n_layers, frames.tokens) == (30, 182)
    assert begin.raw_bytes == 182 * SMOLLM2.bytes_per_token
    chunks = [c for layer in range(frames.n_layers) for c in frames.layer_chunks(layer)]
    got = dict(decoded_layers([(c.layer, c.codec_id, bytes(c.codec_header), bytes(c.payload), tuple(c.shape))
                               for c in chunks], 6))
    assert all(np.array_equal(got[layer], rows[layer][:, :182]) for layer in range(30))
    # Request 1 is past --real-kv-requests: synthetic KV of its own prompt, as ever.
    begin, frames = agent.stager.make_frames(Request(request_id=1, prompt_tokens=2048, output_tokens=8, sent_ns=0), 123)
    assert (begin.n_layers, frames.tokens, begin.raw_bytes) == (32, 2048, scenario.kv_layout.request_bytes(2048))
    carried = real_kv_of(agent).stats()["real_kv"]["requests"]
    assert carried == {"0": {"window": "gpl-3@0", "tokens": 182, "wanted": 182}}


def _decode_stats(**block) -> dict:
    base = {"pending": 0, "failed": {}, "failure": "", "raw_mismatches": 0, "model": "SmolLM2-test",
            "per_request": {}, "sums": {}}
    return {"role": "decode", "accuracy_model": {**base, **block}}


def test_the_report_pools_decode_readings_over_instances_token_by_token():
    scenario = Scenario(kv_sample="real", accuracy="model", real_kv_requests=3)
    sums_a = {"scored": 32, "nll_reference": 64.0, "nll": 70.0, "kl": 3.2, "agree": 30, "k_err2": 1.0, "k_ref2": 100.0,
              "v_err2": 4.0, "v_ref2": 100.0}
    sums_b = {"scored": 64, "nll_reference": 128.0, "nll": 128.0, "kl": 0.0, "agree": 64, "k_err2": 0.0,
              "k_ref2": 100.0, "v_err2": 0.0, "v_ref2": 100.0}
    decodes = [_decode_stats(sums=sums_a, per_request={"0": {"window": "gpl-3@0", "tokens": 91, "top1": 30 / 32}}),
               _decode_stats(sums=sums_b, per_request={"1": {"window": "gpl-3@3072", "tokens": 120, "top1": 1.0},
                                                       "2": {"window": "json-decoder@0", "tokens": 64, "top1": 1.0}})]
    prefills = [{"role": "prefill", "real_kv": {"model": "SmolLM2-test", "capped": [2],
                                                "requests": {"2": {"window": "json-decoder@0", "tokens": 512,
                                                                   "wanted": 900}}}}]
    block = model_accuracy_block(scenario, prefills, decodes)
    assert block["measured"] == 3 and block["scored_tokens"] == 96
    assert block["top1"] == pytest.approx(94 / 96)  # token-weighted, not a mean of the two instances' shares
    assert block["kl"] == pytest.approx(3.2 / 96)
    assert block["ppl_increase"] == pytest.approx(np.exp(198 / 96) / np.exp(192 / 96) - 1)
    assert block["k_relative_error"] == pytest.approx((1 / 200) ** 0.5)
    assert block["capped_requests"] == [2] and block["per_request"]["2"]["wanted"] == 900
    assert model_accuracy_errors(block) == []
    assert "top-1 97.9%" in model_accuracy_line(block)


def test_a_reading_that_failed_or_is_still_pending_is_an_error_in_the_report_never_a_silent_gap():
    scenario = Scenario(kv_sample="real", accuracy="model", real_kv_requests=2)
    block = model_accuracy_block(scenario, [], [_decode_stats(pending=1, failed={"0": "the worker is gone"})])
    assert model_accuracy_errors(block) == ["accuracy model: request 0 not read: the worker is gone",
                                            "accuracy model: 1 reading(s) still pending when the report was written"]
    assert model_accuracy_line(block).startswith("model accuracy: not measured")
    nothing = model_accuracy_block(scenario, [], [_decode_stats()])
    assert model_accuracy_errors(nothing) == ["accuracy model: not measured: no real-KV hand-off reached decode"]


@pytest.mark.slow  # starts a process
def test_up_without_the_extra_says_what_to_install_before_starting_anything(tmp_path):
    # The extra hidden (find_spec, which the check uses, finds neither torch nor transformers): one line, exit 2.
    code = ("import importlib.util, sys\n"
            "found = importlib.util.find_spec\n"
            "hidden = ('torch', 'transformers')\n"
            "importlib.util.find_spec = lambda name, *a: None if name in hidden else found(name, *a)\n"
            "from kvtransit.cli import main\n"
            "sys.exit(main(['up', '--kv-sample', 'real', '--links', 'loopback']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "the real-model extra is not installed (missing: torch, transformers)" in done.stderr
    assert "pip install -e '.[realkv]'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


def test_a_cluster_render_refuses_real_kv_naming_what_its_pods_lack():
    from kvtransit.harness.deploy.k8s.scenario_configmap import refuse_host_files

    with pytest.raises(ConfigError, match=r"--kv-sample real: kvtransit k8s render runs in pods, whose image has no "
                                          r"real-model extra"):
        refuse_host_files(Scenario(kv_sample="real"), "kvtransit k8s render")


def test_the_precision_test_judges_a_lossy_kernel_by_the_live_reading_when_every_request_was_read():
    from kvtransit.model.judge.five_tests import PrecisionMeasured, precision_test
    from kvtransit.report.build import live_task_loss

    scenario = Scenario(kv_sample="real", accuracy="model", real_kv_requests=1, codec="freq-keep-k")
    sums = {"scored": 32, "nll_reference": 64.0, "nll": 66.0, "kl": 1.6, "agree": 28, "k_err2": 1.0, "k_ref2": 100.0,
            "v_err2": 1.0, "v_ref2": 100.0}
    block = model_accuracy_block(scenario, [], [_decode_stats(
        sums=sums, per_request={"0": {"window": "gpl-3@0", "tokens": 182}})])
    task = live_task_loss(scenario, block)
    assert task is not None and task.ppl_increase == pytest.approx(np.exp(2 / 32) - 1) and not task.within_tolerance
    judged = precision_test(scenario.codec_declaration, PrecisionMeasured(0, None, None), task)
    assert judged.passed is False and "reading the KV that crossed this run's link" in judged.reason
    # A reading still out, or one that failed, leaves the test to the tensor errors: never half a measurement.
    assert live_task_loss(scenario, {**block, "pending": 1}) is None
    assert live_task_loss(scenario, {**block, "failed": {"0": "gone"}}) is None
    assert live_task_loss(scenario, None) is None
