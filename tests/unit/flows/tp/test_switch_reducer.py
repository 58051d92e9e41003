"""The switch's bookkeeping, sans-IO (flows/tp/switch/reducer.py): exact sums, one collective at a time, unknown
groups and steps rejected with a reason, the kernel judged against the module and its energy charged."""

from __future__ import annotations

import numpy as np
import pytest

from kvtransit.flows.tp.rank.payloads import Payloads
from kvtransit.flows.tp.switch.reducer import GroupReducer, Rejected
from kvtransit.model.module.budget import Module, Verdict


def _feed(reducer: GroupReducer, payloads: Payloads, step: int, collective: int, due_ns: int = 0):
    out = None
    for rank in range(reducer.size):
        out = reducer.accept(reducer.group, rank, step, collective, payloads.part(rank, step, collective).tobytes(),
                             due_ns + rank)
    return out


@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_nth_part_completes_the_exact_sum_and_names_the_last_due_time(n):
    payloads = Payloads(64, n)
    reducer = GroupReducer(group=3, size=n)
    for rank in range(n - 1):
        assert reducer.accept(3, rank, 0, 0, payloads.part(rank, 0, 0).tobytes(), 100) is None
    done = reducer.accept(3, n - 1, 0, 0, payloads.part(n - 1, 0, 0).tobytes(), 250)
    assert done is not None
    assert payloads.is_exact_sum(done.total, 0, 0)
    assert (done.step, done.collective, done.last_due_ns, done.input_bytes) == (0, 0, 250, n * 128)


def test_a_group_this_switch_does_not_serve_is_rejected():
    reducer = GroupReducer(group=1, size=2)
    with pytest.raises(Rejected, match="unknown group 9 \\(this switch serves group 1\\)"):
        reducer.accept(9, 0, 0, 0, b"\0\0", 0)


def test_steps_out_of_order_are_rejected_as_unknown_or_already_summed():
    payloads = Payloads(8, 2)
    reducer = GroupReducer(group=1, size=2)
    with pytest.raises(Rejected, match="step 5 from rank 0: unknown step"):
        reducer.accept(1, 0, 5, 0, payloads.part(0, 5, 0).tobytes(), 0)
    assert _feed(reducer, payloads, 0, 0) is not None
    with pytest.raises(Rejected, match="already summed"):
        reducer.accept(1, 1, 0, 0, payloads.part(1, 0, 0).tobytes(), 0)
    reducer.accept(1, 0, 0, 1, payloads.part(0, 0, 1).tobytes(), 0)
    with pytest.raises(Rejected, match="step 0, all-reduce 1 is in progress"):
        reducer.accept(1, 1, 1, 0, payloads.part(1, 1, 0).tobytes(), 0)
    with pytest.raises(Rejected, match="rank 0 sent step 0, all-reduce 1 twice"):
        reducer.accept(1, 0, 0, 1, payloads.part(0, 0, 1).tobytes(), 0)
    with pytest.raises(Rejected, match="rank 2 is not in group 1 of 2"):
        reducer.accept(1, 2, 0, 1, payloads.part(0, 0, 1).tobytes(), 0)


def test_parts_of_different_sizes_are_rejected():
    reducer = GroupReducer(group=1, size=2)
    reducer.accept(1, 0, 0, 0, np.zeros(4, dtype=Payloads(4, 2).part(0, 0, 0).dtype).tobytes(), 0)
    with pytest.raises(Rejected, match="has 4 B, the others 8 B"):
        reducer.accept(1, 1, 0, 0, b"\0" * 4, 0)


def test_the_sum_kernel_is_judged_against_the_module_and_charged_at_model_scale():
    assert GroupReducer(group=1, size=4).budget.verdict is Verdict.FITS  # 0.50 op/B within the sim's 1.6
    assert GroupReducer(group=1, size=4, module=Module(ops_per_byte=0.40)).budget.verdict is Verdict.TRANSIT_BOUND
    payloads = Payloads(64, 4)
    reducer = GroupReducer(group=1, size=4, scale=0.5)
    _feed(reducer, payloads, 0, 0)
    # 4 × 128 B in at scale 0.5 = 1,024 model bytes × 8 bits × 1 pJ (docs/reference.md §5)
    assert reducer.energy_j == pytest.approx(1024 * 8 * 1e-12)
    assert (reducer.sums, reducer.input_bytes) == (1, 512)


def test_payloads_sum_exactly_in_bf16_for_every_group_size():
    for n in (2, 3, 4, 8):
        payloads = Payloads(40, n)
        for step, collective in ((0, 0), (3, 7), (11, 159)):
            total = sum(payloads.part(r, step, collective).astype(np.float32) for r in range(n))
            assert np.array_equal(total, payloads.expected(step, collective).astype(np.float32))


def test_the_blocked_sum_is_the_kernels_sum_bit_for_bit():
    from kvtransit.flows.tp.switch.reducer import SUM_BLOCK_VALUES, blocked_sum
    from kvtransit.kernels.stream_sum import BF16, sum_streams

    rng = np.random.default_rng(7)
    parts = [rng.standard_normal(SUM_BLOCK_VALUES * 2 + 5).astype(np.float32).astype(BF16) for _ in range(3)]
    assert np.array_equal(blocked_sum(parts).view(np.uint16), sum_streams(parts).view(np.uint16))
