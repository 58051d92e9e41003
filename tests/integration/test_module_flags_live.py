"""The module's unknowns as scenario fields, live: a run honours them from its start, no `PUT /kernel`.

Real processes on loopback, as in test_serving_loop.py. freq-keep-k on blocks of 64 tokens is an FFT of length
64: 1.25 · log2 64 = 7.50 ops per byte (docs/reference.md §5 kernel table). Charged against the low budget (0.40 ops
per line byte), the module's compute outlasts the wire, so each hand-off takes docs/reference.md §5's
`latency + module latency + max(wire / bw, ops / (budget × bw))`, ops over the KV (input) bytes, instead of the
wire's time. Light load: hand-offs rarely meet, so each can be held against the formula.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

import pytest

from kvtransit.agents.middlebox.stages.chain import ChainSettings
from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.judge import fidelity
from kvtransit.model.scenario import Scenario
from kvtransit.report.text import headline
from kvtransit.runtime.clock import MonotonicClock

pytestmark = pytest.mark.timeout(180)

# Light: a request every 2 s on average, short prompts (a 256-token hand-off held by the module at the low
# budget is 32 MB × 7.5 / (0.4 × 3.125 GB/s) ≈ 0.19 s on eth-25g), short outputs: hand-offs rarely meet.
# (At 1 req/s and 512-token prompts, hand-offs of ~0.4 s queued behind each other: median 1.26x the formula.)
LIGHT = dict(rate=0.5, requests=8, prompt_mean=256.0, prompt_cv=0.5, output_mean=16.0, output_cv=0.5,
             codec="freq-keep-k", block=64, keep=0.5, module_budget="low")
CHARGED = dict(LIGHT, transform_charged=True)
FREE = dict(LIGHT, transform_charged=False)


def _run(tmp_path: Path, name: str, **fields) -> dict:
    launcher = Launcher(Scenario.build(**fields), report_path=tmp_path / f"{name}.json", drain_timeout_s=20.0,
                        figures=False, accuracy_sample=0, log=lambda _msg: None)
    path = asyncio.run(launcher.run())
    assert path is not None
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def charged_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("charged"), "charged", **CHARGED)


@pytest.fixture(scope="module")
def free_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("free"), "free", **FREE)


def _prescribed_s(scenario: Scenario, prompt_tokens: int, wire_per_kv_byte: float) -> float:
    """docs/reference.md §5, written out again here: link latency + 1 µs + max(wire / bw, ops / (budget × bw))."""
    link = scenario.link_spec
    kv_bytes = scenario.model_spec.kv_bytes(prompt_tokens)
    wire_s = kv_bytes * wire_per_kv_byte / link.bandwidth_Bps
    compute_s = kv_bytes * 7.50 / (0.40 * link.bandwidth_Bps)  # FFT length 64 charged, low budget
    return link.latency_s + 1e-6 + max(wire_s, compute_s)


def _handoffs(report: dict) -> list[dict]:
    return [r for r in report["per_request"] if r["handoff_s"] is not None]


def test_the_middlebox_takes_the_module_terms_from_the_scenario():
    settings = ChainSettings.from_scenario(Scenario.build(**CHARGED, precision_bits=8, placement="switch",
                                                    module_pj_per_bit=2.0, module_latency_us=3.0),
                                           link_backend="userspace", kernel_threads=1, clock=MonotonicClock())
    kernel, module = settings.kernel, settings.module
    assert (kernel.transform_charged, kernel.precision_bits, kernel.placement) == (True, 8, "switch")
    assert (module.ops_per_byte, module.pj_per_input_bit, module.added_latency_s) == (
        0.40, 2.0, pytest.approx(3e-6))
    assert settings.module_latency_s == pytest.approx(3e-6 * settings.dilation)  # rides on the delay line


def test_every_request_of_the_transit_bound_run_completes(charged_run):
    req = charged_run["requests"]
    assert req["failed"] == 0 and req["timed_out"] == 0 and req["total"] == LIGHT["requests"], req


def test_the_middleboxs_chain_shows_the_scenarios_module_terms(charged_run):
    middleboxes = [a for a in charged_run["run"]["agents"] if a.get("role") == "middlebox"]
    assert middleboxes, [a.get("role") for a in charged_run["run"]["agents"]]
    kernel, module = middleboxes[0]["chain"][0], middleboxes[0]["chain"][1]
    assert (kernel["stage"], kernel["transform_charged"], kernel["runs"], kernel["transit_bound"]) == (
        "kernel", True, "module", True)
    assert kernel["charged_ops_per_byte"] == pytest.approx(7.50)
    assert (module["stage"], module["ops_per_byte_budget"]) == ("module", 0.40)


def test_the_transit_bound_hand_off_is_the_module_formula_at_light_load(charged_run):
    """The median hand-off against latency + 1 µs + max(wire / bw, ops / (budget × bw)), within the band the
    light-load hand-off tests use (test_serving_loop.py): 10 % here, and the run's own fidelity check (2 %
    or 1 ms on the median of the hand-offs that found the link idle) judges against the same terms."""
    scenario = Scenario.build(**CHARGED)
    wire_per_kv_byte = charged_run["link"]["wire_bytes"] / charged_run["link"]["kv_bytes"]
    ratios = [r["handoff_s"] / _prescribed_s(scenario, r["prompt_tokens"], wire_per_kv_byte)
              for r in _handoffs(charged_run)]
    assert len(ratios) >= LIGHT["requests"] - 2, ratios  # single-token outputs have no hand-off
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.10), sorted(ratios)
    # The 2 % is the check's own rule (2 %, or 1 ms for short hand-offs; these are ~170 ms): asserting
    # the check, not a second copy of its arithmetic, keeps the test and the product on one rule.
    check = charged_run["fidelity"]["handoff_model"]
    assert check["ok"], check


def test_the_report_says_the_run_was_transit_bound(charged_run):
    module = charged_run["config"]["module"]
    assert (module["budget"], module["budget_ops_per_byte"], module["transform_charged"], module["transit_bound"]) == (
        "low", 0.40, True, True)
    assert module["charged_ops_per_byte"] == pytest.approx(7.50)
    assert module["transit_bound_frames"] > 0  # the middlebox's module stage found its frames slower than the wire
    assert any("transit-bound" in line for line in headline(charged_run))


def test_a_transit_bound_links_busy_rate_is_the_modules_not_the_wires(charged_run):
    """The link carries its wire bytes over the module's compute time: its busy rate is bw × (wire / KV) ×
    budget / charged (fidelity.link_rate_target_Bps), ~2.7 % of the shaped rate here, not the rate itself."""
    link = charged_run["link"]
    target = fidelity.link_rate_target_Bps(Scenario.build(**CHARGED), link["scaled_configured_Bps"],
                                           link["wire_bytes"] / link["kv_bytes"])
    assert target < link["scaled_configured_Bps"] / 30
    assert fidelity.link_gap(link["scaled_achieved_Bps"], target, 1.0, 1.0).ok, (link, target)


def test_a_charged_transform_is_slower_than_a_free_one(charged_run, free_run):
    charged = statistics.median(r["handoff_s"] for r in _handoffs(charged_run))
    free = statistics.median(r["handoff_s"] for r in _handoffs(free_run))
    # Same requests, same bytes on the wire; the model says ×37.5 (7.5 × ratio 2 / 0.4). The free run's hand-offs
    # of 256 tokens are themselves late on a 2-core box (the host kernel's per-chunk overhead: measured 3.9x
    # their 5 ms model, median 17 ms against 168 ms charged), so only a clear margin is asked for.
    assert charged > 3 * free, (charged, free)
    assert free_run["config"]["module"]["transit_bound"] is False
    assert free_run["config"]["module"]["transit_bound_frames"] == 0
    assert free_run["link"]["wire_bytes"] == charged_run["link"]["wire_bytes"]
