"""Topology building through a recording runner: exact names, manifest, cleanup order, rollback, clashes."""

from __future__ import annotations

import json

import pytest

from kvtransit.shaping.backend import Capabilities
from kvtransit.shaping.errors import CommandFailed, ShapingError
from kvtransit.shaping.manifest import Manifest, cleanup, cleanup_argv_plan
from kvtransit.shaping.runner import RecordingRunner
from kvtransit.shaping.spec import LinkSpec
from kvtransit.shaping.topology import LinkPlan, build_testbed

CAPS = Capabilities(root=True, tc=True, qdiscs={"tbf": True, "htb": True, "netem": False, "bfifo": True})
AGENTS = ["prefill", "middlebox", "decode"]
LINKS = [LinkPlan("prefill", "middlebox"), LinkPlan("middlebox", "decode", LinkSpec.parse(rate="200mbit"))]


def _build(runner, tmp_path, **kw):
    return build_testbed(AGENTS, LINKS, runner=runner, capabilities=CAPS, manifest_path=tmp_path / "m.json",
                         run_id="kvtabc123-", **kw)


def test_build_creates_namespaces_veths_addresses_and_shaping_in_order(tmp_path):
    runner = RecordingRunner()
    bed = _build(runner, tmp_path)
    assert runner.calls[0] == ["ip", "netns", "list"]  # the clash check comes first
    creates = [c for c in runner.calls if c[:3] == ["ip", "netns", "add"]]
    assert creates == [["ip", "netns", "add", f"kvtabc123-{a}"] for a in AGENTS]
    assert ["ip", "link", "add", "kvtabc123-1a", "netns", "kvtabc123-middlebox", "mtu", "1500", "type", "veth",
            "peer", "name", "kvtabc123-1b", "netns", "kvtabc123-decode", "mtu", "1500"] in runner.calls
    shaping = [c for c in runner.calls if c[0] == "tc"]
    assert len(shaping) == 1
    assert shaping[0][2:8] == ["kvtabc123-middlebox", "qdisc", "add", "dev", "kvtabc123-1a", "root"]
    assert bed.address("decode", "middlebox") == "10.77.1.2"
    assert bed.address("middlebox", "decode") == "10.77.1.1"
    assert bed.link("decode", "middlebox").plan.rate == "tbf"
    assert bed.exec_argv("decode", ["python"]) == ["ip", "netns", "exec", "kvtabc123-decode", "python"]


def test_manifest_round_trips_and_lists_exactly_what_was_made(tmp_path):
    bed = _build(RecordingRunner(), tmp_path)
    loaded = Manifest.load(tmp_path / "m.json")
    assert loaded.run_id == "kvtabc123-"
    assert loaded.resources == bed.manifest.resources
    assert [r["kind"] for r in loaded.resources] == ["netns", "netns", "netns", "veth", "veth", "qdisc"]
    assert loaded.info["links"][1]["backends"]["rate"] == "tbf"


def test_cleanup_deletes_newest_first_and_only_what_still_exists(tmp_path):
    bed = _build(RecordingRunner(), tmp_path)
    ns = {f"kvtabc123-{a}" for a in AGENTS} - {"kvtabc123-prefill"}  # prefill's namespace vanished already
    links = {"kvtabc123-middlebox": {"kvtabc123-0b", "kvtabc123-1a"}, "kvtabc123-decode": {"kvtabc123-1b"}}
    assert cleanup_argv_plan(bed.manifest, ns, links) == [
        ["tc", "-n", "kvtabc123-middlebox", "qdisc", "del", "dev", "kvtabc123-1a", "root"],
        ["ip", "-n", "kvtabc123-middlebox", "link", "del", "kvtabc123-1a"],
        ["ip", "-n", "kvtabc123-middlebox", "link", "del", "kvtabc123-0b"],  # its prefill end went with the netns
        ["ip", "netns", "del", "kvtabc123-decode"],
        ["ip", "netns", "del", "kvtabc123-middlebox"],
    ]


def test_cleanup_never_touches_a_namespace_the_manifest_does_not_list(tmp_path):
    bed = _build(RecordingRunner(), tmp_path)
    listing = "someone-elses (id: 3)\nkvtabc123-decode (id: 7)\n"
    runner = RecordingRunner(outputs={("ip", "netns", "list"): listing})
    ran = cleanup(bed.manifest, runner)
    assert ran == [["ip", "netns", "del", "kvtabc123-decode"]]
    assert not any("someone-elses" in " ".join(c) for c in runner.calls if c[:3] != ["ip", "netns", "list"])


def test_a_failing_command_rolls_back_and_reports_the_command_and_stderr(tmp_path):
    def fail_on_veth_to_decode(argv):
        return "RTNETLINK answers: File exists" if "kvtabc123-1a" in argv and "veth" in argv else None

    runner = RecordingRunner(fail_when=fail_on_veth_to_decode)
    with pytest.raises(CommandFailed) as info:
        _build(runner, tmp_path)
    assert "kvtabc123-1a" in info.value.argv and "File exists" in str(info.value)
    failed_at = next(i for i, c in enumerate(runner.calls) if "kvtabc123-1a" in c)
    undo = runner.calls[failed_at + 1:]
    assert undo == [
        ["ip", "-n", "kvtabc123-prefill", "link", "del", "kvtabc123-0a"],
        ["ip", "netns", "del", "kvtabc123-decode"],
        ["ip", "netns", "del", "kvtabc123-middlebox"],
        ["ip", "netns", "del", "kvtabc123-prefill"],
    ]


def test_an_existing_namespace_name_is_an_error_before_anything_is_created(tmp_path):
    runner = RecordingRunner(outputs={("ip", "netns", "list"): "kvtabc123-decode (id: 0)\n"})
    with pytest.raises(ShapingError, match="namespace='kvtabc123-decode': already exists"):
        _build(runner, tmp_path)
    assert runner.calls == [["ip", "netns", "list"]]


def test_an_unrealisable_spec_is_an_error_before_anything_is_created(tmp_path):
    runner = RecordingRunner()
    with pytest.raises(ShapingError, match="loss_pct"):
        build_testbed(["a", "b"], [LinkPlan("a", "b", LinkSpec(rate_Bps=1e6, loss_pct=5.0))], runner=runner,
                      capabilities=CAPS)
    assert runner.calls == []


@pytest.mark.parametrize("agents,links,field", [
    (["a", "a"], [], "agents"),
    (["A"], [], "agent"),
    (["a", "b"], [LinkPlan("a", "c")], "link"),
    (["a", "b"], [LinkPlan("a", "b"), LinkPlan("b", "a")], "link"),
])
def test_bad_topologies_are_refused_naming_what_is_wrong(agents, links, field):
    with pytest.raises(ShapingError) as info:
        build_testbed(agents, links, runner=RecordingRunner(), capabilities=CAPS)
    assert info.value.field == field


def test_change_retunes_in_place_and_down_up_toggle_both_ends(tmp_path):
    runner = RecordingRunner()
    bed = _build(runner, tmp_path)
    runner.calls.clear()
    bed.change("middlebox", "decode", LinkSpec.parse(rate="50mbit"))
    bed.set_state("middlebox", "decode", "down")
    assert runner.calls[0][:7] == ["tc", "-n", "kvtabc123-middlebox", "qdisc", "change", "dev", "kvtabc123-1a"]
    assert runner.calls[1:] == [["ip", "-n", "kvtabc123-middlebox", "link", "set", "kvtabc123-1a", "down"],
                                ["ip", "-n", "kvtabc123-decode", "link", "set", "kvtabc123-1b", "down"]]
    assert bed.link("middlebox", "decode").spec.rate_Bps == 50e6 / 8


def test_change_that_needs_another_back_end_is_refused(tmp_path):
    bed = _build(RecordingRunner(), tmp_path)
    with pytest.raises(ShapingError, match="rebuild"):
        bed.change("middlebox", "decode", LinkSpec.parse(rate="50mbit", latency="5ms"))


def test_a_manifest_that_is_not_ours_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ShapingError, match="not a kvtransit links manifest"):
        Manifest.load(path)


# -- the root namespace as an agent ("host") ---------------------------------------------------------------

HOST_LINKS = [LinkPlan("host", "middlebox"), LinkPlan("middlebox", "decode", LinkSpec.parse(rate="200mbit")),
              LinkPlan("host", "decode")]
ROOT_ROUTES = "default via 192.0.2.1 dev eth0\n192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2\n"


def _build_with_host(runner, tmp_path):
    return build_testbed(["host", "middlebox", "decode"], HOST_LINKS, runner=runner, capabilities=CAPS,
                         manifest_path=tmp_path / "m.json", run_id="kvt000010-")


def test_the_host_agent_is_the_root_namespace_and_gets_no_namespace(tmp_path):
    runner = RecordingRunner(outputs={("ip", "-o", "-4", "route", "show"): ROOT_ROUTES})
    bed = _build_with_host(runner, tmp_path)
    assert [c for c in runner.calls if c[:3] == ["ip", "netns", "add"]] == [
        ["ip", "netns", "add", "kvt000010-middlebox"], ["ip", "netns", "add", "kvt000010-decode"]]
    # The host's end of a veth is born in the root namespace (no `netns`), addressed without `-n`.
    assert ["ip", "link", "add", "kvt000010-0a", "mtu", "1500", "type", "veth", "peer", "name", "kvt000010-0b",
            "netns", "kvt000010-middlebox", "mtu", "1500"] in runner.calls
    assert ["ip", "addr", "add", "10.78.16.1/24", "dev", "kvt000010-0a"] in runner.calls
    assert bed.namespace("host") is None
    assert bed.exec_argv("host", ["python"]) == ["python"]
    # Root links take 10.78.x/24 from the run id's offset (0x10 = 16); namespace-only links keep 10.77.i.
    assert bed.address("middlebox", "host") == "10.78.16.2"
    assert bed.address("decode", "middlebox") == "10.77.1.2"
    assert bed.address("decode", "host") == "10.78.17.2"


def test_root_links_skip_every_subnet_a_root_route_overlaps(tmp_path):
    routes = ROOT_ROUTES + "10.78.16.0/24 dev docker0\n10.78.17.128/25 dev other\n"
    bed = _build_with_host(RecordingRunner(outputs={("ip", "-o", "-4", "route", "show"): routes}), tmp_path)
    assert bed.address("middlebox", "host") == "10.78.18.2"
    assert bed.address("decode", "host") == "10.78.19.2"


def test_a_root_route_covering_the_whole_range_is_refused_before_anything_is_made(tmp_path):
    runner = RecordingRunner(outputs={("ip", "-o", "-4", "route", "show"): "10.0.0.0/8 dev vpn0\n"})
    with pytest.raises(ShapingError, match="no free /24"):
        _build_with_host(runner, tmp_path)
    assert not [c for c in runner.calls if "add" in c]


def test_cleanup_deletes_the_root_veth_ends_by_exact_name(tmp_path):
    bed = _build_with_host(RecordingRunner(outputs={("ip", "-o", "-4", "route", "show"): ROOT_ROUTES}), tmp_path)
    loaded = Manifest.load(tmp_path / "m.json")
    assert loaded.resources[2] == {"kind": "veth", "netns": None, "dev": "kvt000010-0a",
                                   "peer_netns": "kvt000010-middlebox", "peer": "kvt000010-0b"}
    listing = {("ip", "netns", "list"): "kvt000010-middlebox (id: 0)\nkvt000010-decode (id: 1)\n",
               ("ip", "-o", "link", "show"): "1: lo: <LOOPBACK>\n7: kvt000010-0a@if2: <UP>\n8: kvt000010-2a@if3: <UP>\n"
                                              "9: eth0: <UP>\n"}
    ran = cleanup(loaded, RecordingRunner(outputs=listing))
    assert ["ip", "link", "del", "kvt000010-2a"] in ran and ["ip", "link", "del", "kvt000010-0a"] in ran
    assert not any("eth0" in c or "lo" in c for c in ran)
    assert ran[-2:] == [["ip", "netns", "del", "kvt000010-decode"], ["ip", "netns", "del", "kvt000010-middlebox"]]
    assert bed.run_id == "kvt000010-"


def test_each_namespace_made_keeps_its_tcp_window_over_idle_gaps_and_the_root_namespace_is_left_alone(tmp_path):
    runner = RecordingRunner()
    build_testbed(["host", "middlebox", "decode"],
                  [LinkPlan("host", "middlebox"), LinkPlan("middlebox", "decode", LinkSpec.parse(rate="200mbit"))],
                  runner=runner, capabilities=CAPS, manifest_path=tmp_path / "m.json", run_id="kvtabc123-")
    sysctls = [c for c in runner.calls if "sysctl" in c]
    assert sysctls == [["ip", "netns", "exec", f"kvtabc123-{agent}", "sysctl", "-q", "-w",
                        "net.ipv4.tcp_slow_start_after_idle=0"] for agent in ("middlebox", "decode")]
