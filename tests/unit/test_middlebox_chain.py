"""The middlebox's stage chain as data (agents/middlebox/stages/chain.py): built from a declaration of
registered kinds, shown by `describe()` (GET /chain), changed by name (PUT /kernel, PUT /link)."""

from __future__ import annotations

import pytest

from kvtransit.agents.middlebox.stages import (
    DEFAULT_CHAIN,
    STAGE_KINDS,
    ChainSettings,
    KernelStage,
    LinkStage,
    StageChain,
)
from kvtransit.agents.middlebox.stages.link import TC_BYPASS_FACTOR, tc_burst_hold_ns
from kvtransit.kernels import KernelInputError
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.clock import ManualClock
from kvtransit.shaping.commands import burst_bytes, wire_rate_Bps
from kvtransit.shaping.spec import SHAPED_MTU


def settings(link_backend: str = "userspace", **overrides) -> ChainSettings:
    scenario = Scenario.build(**{"codec": "freq-keep-k", "link": "eth-25g", "scale": 1.0, "dilation": 3.125,
                                 **overrides})
    return ChainSettings.from_scenario(scenario, link_backend=link_backend, kernel_threads=1, clock=ManualClock())


@pytest.fixture
def chain():
    built = StageChain.build(settings())
    yield built
    built.close()


def test_the_default_chain_is_kernel_module_link_built_from_registered_kinds(chain):
    assert DEFAULT_CHAIN == ("kernel", "module", "link") and set(STAGE_KINDS) == set(DEFAULT_CHAIN)
    assert [stage["stage"] for stage in chain.describe()] == ["kernel", "module", "link"]
    assert isinstance(chain.kernel, KernelStage) and isinstance(chain.link, LinkStage)
    assert chain.describe()[0]["codec"] == "freq-keep-k"


@pytest.mark.parametrize("declaration,message", [
    (("kernel", "module", "tap", "link"), "unknown stage 'tap'"),
    (("module", "kernel", "link"), "in that order"),
    (("kernel", "link"), "in that order"),
    (("kernel", "module", "link", "link"), "each once"),
])
def test_a_declaration_the_middlebox_cannot_run_is_refused_naming_it(declaration, message):
    with pytest.raises(ConfigError, match=message):
        StageChain.build(settings(codec="none"), declaration)


def test_a_stage_is_changed_by_name_and_a_refused_change_leaves_it_as_it_was(chain):
    chain.reconfigure("kernel", {"keep": 0.25})
    assert chain.describe()[0]["keep"] == 0.25 and chain.describe()[0]["codec"] == "freq-keep-k"
    before = chain.describe()
    with pytest.raises(ConfigError, match="refused by the module"):  # fp8 needs rounding: policy "reject"
        chain.reconfigure("kernel", {"codec": "fp8"})
    with pytest.raises(KernelInputError, match="zstd"):
        chain.reconfigure("kernel", {"codec": "zstd"})
    with pytest.raises(ConfigError, match="no live settings"):
        chain.reconfigure("module", {"ops_per_byte_budget": 3})
    with pytest.raises(ConfigError, match="unknown stage 'tap'"):
        chain.reconfigure("tap", {})
    assert chain.describe() == before


def test_link_changes_keep_what_they_do_not_name(chain):
    chain.reconfigure("link", {"latency_s": 0.002})
    chain.reconfigure("link", {"rate_Bps": 5e8})
    link = chain.describe()[2]
    assert link["rate_Bps"] == 5e8 and link["latency_s"] == pytest.approx(0.002)
    chain.reconfigure("link", {"jitter_s": 0.0001})
    assert chain.describe()[2]["latency_s"] == pytest.approx(0.002)


def test_with_tc_the_link_refuses_a_rate_change_and_holds_a_hand_off_for_what_tbf_lets_through_at_once():
    tc = StageChain.build(settings("tc"))
    try:
        link = tc.link
        with pytest.raises(ConfigError, match="shaped by tc"):
            tc.reconfigure("link", {"rate_Bps": 1e6, "latency_s": 0.5})
        assert link.latency_s == pytest.approx(link.link.latency_s)  # refused as a whole: latency unchanged
        assert link.shaper.rate_Bps == link.link.bandwidth_Bps * TC_BYPASS_FACTOR
        assert link.shaped_rate_Bps == link.link.bandwidth_Bps
        wire = wire_rate_Bps(link.link.bandwidth_Bps, SHAPED_MTU)
        full_burst_ns = tc_burst_hold_ns(link.link.bandwidth_Bps)
        assert full_burst_ns == round(burst_bytes(wire) / wire * 1e9)
        # A hand-off after an idle gap is held by tbf's full burst; one straight behind it finds no tokens.
        assert link.burst_hold_ns(10**12, 10**9) == pytest.approx(full_burst_ns, abs=1)
        link.on_wire(10**12, 10**9)
        assert link.burst_hold_ns(10**12, 10**9) == 0
    finally:
        tc.close()


def test_an_unknown_link_backend_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="userspace, tc"):
        settings("ebpf")


@pytest.mark.parametrize("codec", ["fp8", "fp4-block", "kivi-2", "kivi-3", "freq-keep-k"])
def test_every_live_codec_starts_from_a_scenario_carrying_band_keeps_block(codec):
    # The scenario's block (64) is band-keep's transform length; fp4-block's block is fixed at 32 by the format.
    # (Policy host: the requantisers round, which the module's published op set does not have.)
    chain = StageChain.build(settings(codec=codec, block=64, policy="host"))
    try:
        assert chain.kernel.kernel.name == codec
    finally:
        chain.close()
