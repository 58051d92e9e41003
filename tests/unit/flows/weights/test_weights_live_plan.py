"""Weight streaming's live parts before any process starts: the model of an instance serving requests one at a time
(flows/weights/model.py: serve_adapter_requests, pull_s), what a run holds and sends (flows/weights/run.py:
plan_weights), the lossless kernels (flows/weights/content.py); a lossy kernel is refused with the reason."""

from __future__ import annotations

import pytest

from kvtransit.cli import main
from kvtransit.flows.weights import content
from kvtransit.flows.weights.content import BlobError, LosslessKernel
from kvtransit.flows.weights.model import AdapterShape, pull_s, serve_adapter_requests
from kvtransit.flows.weights.run import plan_weights
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.cost.roofline import prefill_step_s
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Policy

LLAMA8, H100, ETH25 = MODELS["llama3-8b"], DEVICES["h100"], LINKS["eth-25g"]


def test_a_pull_is_the_request_then_the_answer():
    assert pull_s(3.125e9, ETH25) == pytest.approx(2 * 20e-6 + 1.0)
    assert pull_s(3.125e9, ETH25, ratio=1.25) == pytest.approx(2 * 20e-6 + 0.8)


def test_a_miss_waits_for_its_load_and_a_busy_instance_queues_the_next_request():
    served = serve_adapter_requests([0.0, 0.05, 1.0], [7, 7, 3], 1, [0.02, 0.02, 0.03], prefill_s=0.1)
    first, second, third = served
    assert (first.hit, first.wait_s, first.ttft_s) == (False, 0.02, pytest.approx(0.12))
    # Same adapter, resident; it arrived while the first was prefilling, so it waits in line for it.
    assert (second.hit, second.start_s, second.ttft_s) == (True, pytest.approx(0.12), pytest.approx(0.17))
    assert (third.hit, third.ttft_s) == (False, pytest.approx(0.13))  # adapter 3 evicted 7: a miss


def test_the_plan_scales_every_byte_and_the_rate_alike_and_holds_the_prefill():
    plan = plan_weights(LLAMA8, H100, ETH25, scale=0.002, requests=10)
    assert plan.weights_bytes == pytest.approx(LLAMA8.resident_weight_bytes * 0.002, abs=2)
    assert plan.adapter_bytes == pytest.approx(AdapterShape(LLAMA8, 16).nbytes * 0.002, abs=2)
    assert plan.rate_Bps == pytest.approx(3.125e9 * 0.002 / plan.dilation)
    assert plan.prefill_s == pytest.approx(prefill_step_s(LLAMA8, H100, 1, [2048]))
    assert len(plan.arrivals_s) == len(plan.adapters) == 10 and plan.arrivals_s == tuple(sorted(plan.arrivals_s))
    assert plan_weights(LLAMA8, H100, ETH25, requests=3).scale == pytest.approx(50e6 / 3.125e9)  # auto


@pytest.mark.parametrize("kw, message", [
    (dict(kernel="freq-keep-k"), "kernel 'freq-keep-k' refused on flow 'weights': the flow needs a lossless kernel"),
    (dict(kernel="fp8"), "refused on flow 'weights'"),
    (dict(kernel="zstd"), "needs comparison, not published) -> rejected; --policy host runs it at the store"),
    (dict(kernel="brotli"), "unknown kernel 'brotli'"),
    (dict(scale=0.5), "over the 1.07 GB a run holds per process: give a --scale of at most 0.0669"),
    (dict(capacity=0), "adapter slots per instance must be an integer >= 1"),
    (dict(requests=0), "--requests, --rate and --prompt must be > 0"),
])
def test_a_weight_flow_that_cannot_run_is_refused_with_the_reason(kw, message):
    with pytest.raises(ConfigError) as info:
        plan_weights(LLAMA8, H100, ETH25, **{"scale": 0.002, **kw})
    assert message in str(info.value)


def test_zstd_runs_at_the_hosts_by_policy():
    assert plan_weights(LLAMA8, H100, ETH25, kernel="zstd", policy=Policy.HOST, scale=0.002).runs_at == "hosts"


@pytest.mark.parametrize("name", ["none", "zstd"])
def test_a_lossless_kernel_gives_back_every_byte_and_a_changed_byte_is_found(name):
    raw = content.adapter(5, 40_000)
    kernel = LosslessKernel(name)
    wire = kernel.encode(raw)
    kernel.decode(wire, raw, "adapter 5")
    if name == "zstd":
        assert len(raw) / len(wire) > 1.2  # BF16 values of a weight's spread (docs/results/weights.md: 1.28)
    with pytest.raises(BlobError, match="adapter 5: byte 10 differs from what was sent"):
        kernel.decode(wire if name == "zstd" else wire[:10] + b"\x00" + wire[11:],
                      raw[:10] + bytes([raw[10] ^ 1]) + raw[11:], "adapter 5")


def test_each_adapter_is_its_own_reproducible_stream():
    assert content.adapter(1, 1000) == content.adapter(1, 1000) != content.adapter(2, 1000)
    assert content.weights(1000) not in (content.adapter(0, 1000),)


@pytest.mark.parametrize("argv, expected", [
    (["--kernel", "kivi-2"], "refused on flow 'weights'"),
    (["--scale", "big"], "'big' is neither a number nor 'auto'"),
])
def test_bad_weights_flags_are_one_line_and_exit_2(capsys, argv, expected):
    try:
        code = main(["weights", *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
