"""`kvtransit cost --tp N / --ep N`: the step split into compute and collectives (docs/reference.md §7), and bad
input."""

import json

import pytest

from kvtransit.cli import main
from kvtransit.flows.tp.model import ring_allreduce_s
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.cost.roofline import decode_step_s


def _run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_tp_prints_compute_allreduce_and_their_shares(capsys):
    status, out, _ = _run(capsys, "cost", "--model", "llama3-70b", "--tp", "4", "--decode-batch", "1",
                          "--context", "2048", "--json")
    assert status == 0
    (split,) = json.loads(out)["parallel"]
    compute = decode_step_s(MODELS["llama3-70b"], DEVICES["h100"], 4, 1, 2048)
    allreduce = 160 * ring_allreduce_s(16_384, 4, LINKS["nvlink4"])
    assert split["compute_s"] == pytest.approx(compute)
    assert split["allreduce_s"] == pytest.approx(allreduce)
    assert split["allreduce_share"] == pytest.approx(allreduce / (compute + allreduce))
    assert split["compute_share"] + split["allreduce_share"] == pytest.approx(1.0)
    assert split["alltoalls"] == 0


def test_ep_prints_the_alltoall_beside_the_attention_allreduce(capsys):
    status, out, _ = _run(capsys, "cost", "--model", "mixtral-8x7b", "--ep", "2", "--allreduce", "switch",
                          "--prefill", "2048,2048,2048,2048")
    assert status == 0
    assert "EP2 over nvlink4, all-reduce switch" in out
    assert "(32×)" in out  # 32 attention all-reduces and 32 dispatch + combine


def test_fp8_dispatch_over_a_scale_out_link_saves_more_than_its_gpu_casts_cost(capsys):
    """On IB NDR (50 GB/s) the dispatch's saved bytes outweigh the casts; on NVLink4 (450 GB/s) they do not."""
    def step_s(*extra: str) -> dict:
        status, out, _ = _run(capsys, "cost", "--model", "mixtral-8x7b", "--ep", "2", "--prefill",
                              "2048,2048,2048,2048", "--json", *extra)
        assert status == 0
        (split,) = json.loads(out)["parallel"]
        return split

    for link, fp8_wins in (("ib-ndr", True), ("nvlink4", False)):
        bf16, fp8 = step_s("--link", link), step_s("--link", link, "--dispatch", "fp8")
        assert bf16["cast_s"] == 0 and fp8["cast_s"] > 0 and fp8["alltoall_s"] < bf16["alltoall_s"]
        assert (fp8["step_s"] < bf16["step_s"]) is fp8_wins, (link, bf16["step_s"], fp8["step_s"])


@pytest.mark.parametrize("argv, expected", [
    (["--model", "llama3-70b", "--tp", "3"],
     "TP 3 does not divide llama3-70b's 64 heads (valid: 1, 2, 4, 8, 16, 32, 64)"),
    (["--model", "llama3-70b", "--ep", "2"], "EP needs a mixture-of-experts model; llama3-70b is dense"),
    (["--model", "mixtral-8x7b", "--ep", "16"], "(valid: 1, 2, 4, 8)"),
    (["--model", "llama3-70b", "--tp", "4", "--gpus", "8"], "--gpus 8 disagrees with the group of 4"),
])
def test_bad_group_is_one_line_with_the_valid_values(capsys, argv, expected):
    status, _, err = _run(capsys, "cost", *argv, "--decode-batch", "1", "--context", "2048")
    assert status == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1


def test_a_switch_below_the_sums_budget_is_slower_than_the_wire(capsys):
    from kvtransit.flows.tp.model import switch_allreduce
    from kvtransit.model.module.budget import Module

    status, out, _ = _run(capsys, "cost", "--model", "llama3-70b", "--tp", "8", "--allreduce", "switch",
                          "--module-budget", "low", "--decode-batch", "1", "--context", "2048", "--json")
    assert status == 0
    (split,) = json.loads(out)["parallel"]
    low = switch_allreduce(16_384, 8, LINKS["nvlink4"], Module(ops_per_byte=0.40)).total_s
    assert split["allreduce_s"] == pytest.approx(160 * low)
    assert low > switch_allreduce(16_384, 8, LINKS["nvlink4"]).total_s
