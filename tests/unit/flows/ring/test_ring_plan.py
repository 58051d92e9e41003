"""What a live ring attention run holds and sends (flows/ring/run.py: plan_ring), before any process starts:
the model's hop and prompt, the effective scale of the sample's blocks, where the codec runs, when time is
dilated; bad rings are one line (flows/ring/cli.py)."""

from __future__ import annotations

import pytest

from kvtransit.cli import main
from kvtransit.cli.accuracy import default_sample_path
from kvtransit.flows.ring.model import block_bytes, hop, layer_s
from kvtransit.flows.ring.run import RUNS_NOWHERE, RUNS_ON_GPU, RUNS_ON_TRANSIT, plan_ring
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Module, Policy

LLAMA8, H100 = MODELS["llama3-8b"], DEVICES["h100"]
SAMPLE = str(default_sample_path())


def _plan(**kw):
    args = dict(n=4, context=32768, sample=SAMPLE)
    args.update(kw)
    link = LINKS[args.pop("link", "eth-100g")]
    return plan_ring(LLAMA8, H100, link, **args)


def test_the_plan_holds_the_models_hop_and_its_prompt_is_every_layers_ring():
    plan = _plan()
    assert plan.runs_on == RUNS_NOWHERE and plan.block_tokens == 8192
    assert plan.modelled == hop(LLAMA8, H100, LINKS["eth-100g"], 8192)
    assert plan.model_prompt_s == pytest.approx(32 * layer_s(LLAMA8, H100, LINKS["eth-100g"], 8192, 4))
    assert plan.compute_s == pytest.approx(plan.modelled.compute_s * plan.dilation)


def test_the_scale_is_the_samples_block_over_the_models_and_the_rate_follows_it():
    plan = _plan(dilation=2.0)
    # The sample's block for n = 4: 96 tokens × K and V × 3 kv heads × 64 × 2 B, for the model's 8,192 tokens.
    assert plan.sample_block_tokens == 96 and plan.sample_block_bytes == 96 * 2 * 3 * 64 * 2
    assert plan.effective_scale == pytest.approx(plan.sample_block_bytes / block_bytes(LLAMA8, 8192))
    assert plan.rate_Bps == pytest.approx(LINKS["eth-100g"].bandwidth_Bps * plan.effective_scale / 2)
    assert plan.latency_s == pytest.approx(LINKS["eth-100g"].latency_s * 2)


def test_auto_dilation_stretches_a_hop_shorter_than_the_host_can_carry():
    # 8 ranks of 512-token blocks over NVLink: a hop of tens of µs, far under a Python hop on 2 cores.
    plan = _plan(n=8, context=4096, link="nvlink4", cores=2)
    assert plan.dilation > 1
    assert plan.modelled.total_s * plan.dilation >= plan.host_codec_s  # at least the kernel's measured time
    assert "auto" in plan.dilation_why and "measured" in plan.dilation_why
    assert _plan(dilation=3.0).dilation == 3.0


def test_band_keep_runs_in_transit_and_a_kernel_the_module_cannot_run_goes_to_the_gpus_only_by_policy():
    assert _plan(codec="freq-keep-k", codec_params={"keep": 0.5, "sinks": 4}).runs_on == RUNS_ON_TRANSIT
    with pytest.raises(ConfigError, match=r"needs rounding.*--policy host runs it at the GPUs"):
        _plan(codec="fp8")
    plan = _plan(codec="fp8", policy=Policy.HOST)
    assert plan.runs_on == RUNS_ON_GPU
    assert plan.rank_plan(0)["module_latency_s"] == 0.0  # no module on the path


def test_a_transit_bound_kernel_holds_the_link_for_its_ops_over_the_budget():
    # freq-keep-k with its FFT charged (--transform-charged) on the low budget: more ops a byte than the module has.
    plan = _plan(codec="freq-keep-k", module=Module(ops_per_byte=0.40), transform_charged=True)
    assert plan.budget is not None and plan.budget.verdict.value == "transit-bound"
    occupancy = plan.rank_plan(0)["module_occupancy"]
    assert occupancy == pytest.approx(plan.declaration.charged_ops_per_byte / 0.40) and occupancy > 1
    assert plan.modelled.link_s > hop(LLAMA8, H100, LINKS["eth-100g"], 8192, ratio=2.0).link_s
    assert plan.rank_plan(0)["module_latency_s"] == pytest.approx(Module().added_latency_s * plan.dilation)


@pytest.mark.parametrize("kw, message", [
    (dict(n=1), "a ring needs n >= 2 ranks"),
    (dict(n=4, context=1000 + 2), "--context 1002 does not split into 4 equal blocks (valid: a multiple of 4)"),
    (dict(n=5, context=40960), "ring of 5 ranks cannot split 384 tokens into equal blocks"),
    (dict(text="poetry"), "no text 'poetry' (choose from: prose, code)"),
    (dict(sample="/nonexistent/kv.npz"), "ring attention's KV"),
    (dict(codec="zstd"), "unknown codec 'zstd'"),
    (dict(prompts=0), "--prompts must be >= 1"),
    (dict(n=64), "a ring of 64 needs 64 processes"),
])
def test_a_ring_that_cannot_run_is_refused_with_the_reason(kw, message):
    with pytest.raises(ConfigError) as info:
        _plan(cores=2, **kw)
    assert message in str(info.value)


@pytest.mark.parametrize("argv, expected", [
    (["--n", "4", "--context", "1001"], "--context 1001 does not split into 4 equal blocks (valid: a multiple of 4)"),
    (["--codec", "fp8"], "--policy host runs it at the GPUs (valid: --policy reject|host)"),
    (["--codec", "fp8", "--bits", "6", "--policy", "host"], "--precision-bits is band-keep's analogue precision"),
    (["--dilation", "fast"], "'fast' is neither a number nor 'auto'"),
    (["--dilation", "0.5"], "--dilation must be >= 1 or auto, got 0.5"),
])
def test_bad_ring_flags_are_one_line_and_exit_2(capsys, argv, expected):
    try:
        code = main(["ring", *argv])
    except SystemExit as exc:  # argparse's own refusals exit from the parser
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert expected in err
    assert len(err.strip().splitlines()) == 1
