"""The module's budget check and transit time (docs/reference.md §5)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import (
    MODULE_BUDGETS,
    Action,
    KernelDeclaration,
    Module,
    Policy,
    Verdict,
    budget_check,
    fft_ops_per_byte,
    fits_budget,
    transit_time,
)


def test_fft_transform_costs_one_and_a_quarter_log2_n_per_bf16_byte():
    assert [fft_ops_per_byte(n) for n in (8, 64, 1024)] == [3.75, 7.5, 12.5]


def test_a_cheap_published_kernel_fits():
    result = budget_check(KernelDeclaration("mac", ops_per_byte=1.0, op_types={"mac"}))
    assert (result.verdict, result.action, result.slowdown) == (Verdict.FITS, Action.IN_TRANSIT, 1.0)


def test_an_expensive_kernel_is_transit_bound_by_charged_over_budget():
    decl = KernelDeclaration("fft1024", op_types={"fft"}, transform_length=1024, transform_charged=True)
    result = budget_check(decl, Module(ops_per_byte=MODULE_BUDGETS["high"]))
    assert result.verdict is Verdict.TRANSIT_BOUND
    assert result.slowdown == pytest.approx(12.5 / 3.96)


def test_a_free_transform_costs_no_budget():
    decl = KernelDeclaration("fft1024", op_types={"fft"}, transform_length=1024, transform_charged=False)
    assert budget_check(decl, Module(ops_per_byte=MODULE_BUDGETS["low"])).fits


@pytest.mark.parametrize("policy,action", [(Policy.REJECT, Action.REJECTED), (Policy.HOST, Action.ON_HOST)])
def test_unpublished_op_is_not_allowed_and_policy_picks_reject_or_host(policy, action):
    decl = KernelDeclaration("topk", ops_per_byte=0.1, op_types={"mac", "topk"})
    result = budget_check(decl, policy=policy)
    assert (result.verdict, result.action, result.unpublished_ops) == (Verdict.NOT_ALLOWED, action, {"topk"})
    assert "topk" in result.describe()


def test_unknown_op_type_is_a_config_error_listing_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown op type 'sort' \(choose from: comparison, fft"):
        KernelDeclaration("x", op_types={"sort"})


def test_transit_time_is_latency_plus_module_plus_max_of_wire_and_compute():
    decl = KernelDeclaration("k", ratio=2.0, ops_per_byte=3.2, op_types={"mac"})
    t = transit_time(1_000_000, decl, link_bandwidth_Bps=1e9, link_latency_s=10e-6)
    assert t.latency_s == pytest.approx(11e-6)
    assert t.wire_s == pytest.approx(500_000 / 1e9)
    assert t.compute_s == pytest.approx(3.2e6 / (1.6 * 1e9))
    assert t.transit_bound
    assert t.total_s == pytest.approx(11e-6 + 2e-3)


_published = st.sets(st.sampled_from(["fft", "ntt", "mac", "modular", "float"]))
_any_ops = st.sets(st.sampled_from(["fft", "mac", "rounding", "topk", "comparison"]))


@given(ops=st.floats(0, 20), ops_types=_any_ops, length=st.sampled_from([None, 8, 64, 1024]),
       charged=st.booleans(), budget=st.sampled_from(sorted(MODULE_BUDGETS.values())))
def test_budget_check_agrees_with_fits_budget_and_the_slowdown_formula(ops, ops_types, length, charged, budget):
    # A transform runs on the fft op, so a declaration with a length lists it.
    decl = KernelDeclaration("k", ops_per_byte=ops, op_types=ops_types | ({"fft"} if length else set()),
                             transform_length=length, transform_charged=charged)
    result = budget_check(decl, Module(ops_per_byte=budget))
    assert result.fits == fits_budget(decl, budget, transform_charged=charged)
    if result.verdict is not Verdict.NOT_ALLOWED:
        assert result.slowdown == pytest.approx(max(1.0, decl.charged_ops_per_byte / budget))
        # The slowdown is what transit_time's compute term does to a ratio-1 kernel's wire time.
        t = transit_time(10**6, decl, 1e9, 0.0, Module(ops_per_byte=budget))
        assert max(t.wire_s, t.compute_s) == pytest.approx(t.wire_s * result.slowdown)


@given(a=st.integers(0, 10**10), b=st.integers(0, 10**10), ops=st.floats(0, 10), ratio=st.floats(1, 16))
def test_transit_time_never_falls_as_bytes_grow(a, b, ops, ratio):
    decl = KernelDeclaration("k", ratio=ratio, ops_per_byte=ops, op_types={"mac"})
    small, large = sorted((a, b))
    assert transit_time(small, decl, 25e9, 5e-6).total_s <= transit_time(large, decl, 25e9, 5e-6).total_s
