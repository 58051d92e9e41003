"""`kvtransit up --links`: which mode is chosen and why, and where each agent then listens and runs.

The decisions run on injected capabilities and a recording runner (no namespaces are made here; the real
ones are tests/system/test_up_netns.py's).
"""

from __future__ import annotations

import pytest

from kvtransit.harness.up.agent_commands import agent_commands
from kvtransit.harness.up.placement import LinksUnavailable, choose_links
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import annotate_report
from kvtransit.report.text import headline
from kvtransit.shaping.backend import Capabilities
from kvtransit.shaping.runner import RecordingRunner

TC = Capabilities(root=True, tc=True, qdiscs={"tbf": True, "htb": True, "netem": False, "bfifo": True})
NOT_ROOT = Capabilities(root=False, tc=True, qdiscs={})


def _choose(mode: str, caps: Capabilities, scenario: Scenario | None = None, runner=None):
    runner = runner or RecordingRunner()
    return choose_links(scenario or Scenario(), mode, manifest_path=None, prober=lambda: caps, runner=runner,
                        run_id="kvt0000aa-"), runner


def test_loopback_never_probes_or_builds():
    def no_probe():
        raise AssertionError("probed")

    setup = choose_links(Scenario(), "loopback", manifest_path=None, prober=no_probe)
    assert (setup.mode, setup.link_backend, setup.backends) == ("loopback", "userspace",
                                                               {"rate": "userspace", "delay": "userspace"})


def test_auto_falls_back_to_loopback_and_says_why():
    setup, runner = _choose("auto", NOT_ROOT)
    assert setup.mode == "loopback" and "not root" in setup.reason
    assert runner.calls == []


def test_netns_that_cannot_be_had_fails_loudly():
    with pytest.raises(LinksUnavailable, match="--links netns: kernel shaping unavailable \\(not root\\)"):
        _choose("netns", NOT_ROOT)


def test_several_link_channels_stay_in_user_space():
    setup, _ = _choose("auto", TC, Scenario(channels=2))
    assert setup.mode == "loopback" and "--channels 2" in setup.reason
    with pytest.raises(LinksUnavailable, match="--channels 2"):
        _choose("netns", TC, Scenario(channels=2))


def test_an_unknown_mode_names_the_choices():
    with pytest.raises(ConfigError, match="auto, netns, loopback"):
        choose_links(Scenario(), "veth", manifest_path=None)


def test_netns_shapes_only_the_middlebox_to_decode_veth_at_the_scaled_goodput():
    scenario = Scenario()
    setup, runner = _choose("auto", TC, scenario)
    assert setup.mode == "netns" and setup.link_backend == "tc"
    assert setup.backends == {"rate": "tc tbf", "delay": "userspace"}
    shaping = [c for c in runner.calls if c[0] == "tc"]
    assert len(shaping) == 1 and shaping[0][2] == "kvt0000aa-middlebox"
    link = setup.testbed.link("middlebox", "decode")
    assert link.spec.rate_Bps == scenario.scaled_link.bandwidth_Bps and link.spec.latency_s == 0
    assert any("no netem" in note for note in setup.notes)


def test_agents_listen_where_the_root_namespace_and_the_shaped_link_reach_them():
    setup, _ = _choose("netns", TC)
    bed = setup.testbed
    commands = agent_commands(Scenario(), link_backend=setup.link_backend, hosts=setup.host)
    decode, middlebox, prefill = commands["decode"], commands["middlebox"], commands["prefill"]
    assert decode[decode.index("--listen") + 1] == f"{bed.address('decode', 'middlebox')}:0"  # over the tbf
    assert decode[decode.index("--client-listen") + 1] == f"{bed.address('decode', 'host')}:0"
    assert decode[decode.index("--metrics-listen") + 1] == f"{bed.address('decode', 'host')}:0"
    for flag in ("--listen", "--metrics-listen", "--control-listen"):
        assert middlebox[middlebox.index(flag) + 1] == f"{bed.address('middlebox', 'host')}:0"
    assert prefill[prefill.index("--listen") + 1] == "127.0.0.1:0"
    for argv in (decode, middlebox):
        assert argv[argv.index("--link-backend") + 1] == "tc"
    assert "--link-backend" not in prefill
    assert setup.wrap("decode", ["x"]) == ["ip", "netns", "exec", "kvt0000aa-decode", "x"]
    assert setup.wrap("prefill", ["x"]) == ["x"]


def test_loopback_commands_are_unchanged_by_the_links_parameters():
    setup = choose_links(Scenario(), "loopback", manifest_path=None)
    assert agent_commands(Scenario(), link_backend=setup.link_backend, hosts=setup.host) == agent_commands(Scenario())


def test_the_report_says_who_shaped_each_property_and_where_prometheus_was():
    report = {"config": {"link": "eth-25g"}, "link": {}}
    setup, _ = _choose("netns", TC)
    annotate_report(report, links=setup.describe(), prometheus_url="http://127.0.0.1:9")
    assert report["config"]["links"]["mode"] == "netns" and report["config"]["links"]["run_id"] == "kvt0000aa-"
    assert report["link"]["backends"] == {"rate": "tc tbf", "delay": "userspace"}
    assert report["prometheus"] == {"url": "http://127.0.0.1:9"}


def test_the_headline_names_the_backends():
    report = {"requests": {"total": 1, "ok": 1, "slo_miss": 0, "failed": 0, "failed_reasons": {}},
              "slo_attainment": 1.0, "goodput_rps": 1.0, "config": {"link": "eth-25g"},
              "link": {"configured_Bps": 1.0, "achieved_Bps": 1.0, "busy": 0.1, "kv_bytes": 1.0, "wire_bytes": 1.0,
                       "backends": {"rate": "tc tbf", "delay": "userspace"}},
              "energy_j": {"link": 1.0, "module": 0.0, "gpu": 1.0}, "j_per_token": 1.0,
              "accuracy": {"codec": "none", "sampled_requests": 0, "k_relative_error": None, "v_relative_error": None},
              "faithful": True, "fidelity": {}, "prometheus": {"url": "http://127.0.0.1:9"}}
    lines = headline(report)
    assert "rate by tc tbf, delay by userspace" in lines[2]
    assert lines[-1].startswith("Prometheus: http://127.0.0.1:9")
