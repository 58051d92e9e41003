"""`kvtransit chaos --render k8s`: one experiment per local chaos scenario, with its name, valid against Chaos
Mesh's published CRDs (vendored, deploy/crds/) or Kubernetes' own schemas; and `--check-ledger` judging a cluster
run's ledger file as a local run's is judged."""

from __future__ import annotations

import json

import pytest
import yaml

from kvtransit.cli import build_parser
from kvtransit.cli._common import CliError
from kvtransit.harness.deploy.k8s.chaos_mesh import (
    CONTROL_FAULTS,
    RATE_COLLAPSE_SHARE,
    ChaosTarget,
    collapsed_bandwidth,
    experiments,
)
from kvtransit.harness.deploy.k8s.naming import COMPONENT, Names
from kvtransit.harness.deploy.k8s.validate import load_directory, problems
from kvtransit.harness.studies import chaos
from kvtransit.model.errors import ConfigError
from kvtransit.shaping.commands import wire_rate_Bps
from kvtransit.shaping.spec import DEFAULT_MTU

TARGET = ChaosTarget(Names("kvtransit"), "chaos-ns", "kvtransit:test")


@pytest.fixture(scope="module")
def built() -> dict[str, dict]:
    return experiments(chaos.chaos_scenario(), TARGET)


def test_every_local_scenario_has_an_experiment_of_the_same_name(built):
    assert list(built) == list(chaos.SCENARIOS)
    assert all(manifest["metadata"]["name"] == name for name, manifest in built.items())


def test_the_experiments_validate_against_chaos_mesh_and_kubernetes_schemas(built):
    assert problems(built.values()) == []


def test_the_validator_refuses_an_experiment_chaos_mesh_would_not_take(built):
    wrong = json.loads(json.dumps(built["latency"]))
    wrong["spec"]["delay"]["latency"] = "20 millis"  # the CRD's pattern wants 20ms
    unknown = json.loads(json.dumps(built["middlebox-kill"]))
    unknown["spec"]["gracePeriodSeconds"] = 0  # PodChaos calls it gracePeriod
    found = problems([wrong, unknown])
    assert len(found) == 2 and "20 millis" in found[0] and "gracePeriodSeconds" in found[1]


def test_network_and_pod_faults_use_the_chaos_mesh_actions_named_for_them(built):
    actions = {name: (m["kind"], m["spec"].get("action")) for name, m in built.items() if m["kind"] != "Job"}
    assert actions == {
        "middlebox-kill": ("PodChaos", "pod-kill"), "decode-restart": ("PodChaos", "pod-failure"),
        "decode-kill": ("PodChaos", "pod-kill"), "link-down": ("NetworkChaos", "partition"),
        "rate-collapse": ("NetworkChaos", "bandwidth"), "loss": ("NetworkChaos", "loss"),
        "latency": ("NetworkChaos", "delay"), "slow-decode": ("NetworkChaos", "partition")}
    link = built["link-down"]["spec"]
    assert (link["selector"]["labelSelectors"][COMPONENT], link["direction"],
            link["target"]["selector"]["labelSelectors"][COMPONENT], link["duration"]) == \
        ("middlebox", "to", "decode", "2s")
    assert built["middlebox-kill"]["spec"]["gracePeriod"] == 0
    assert built["decode-kill"]["spec"]["selector"]["labelSelectors"]["statefulset.kubernetes.io/pod-name"] == \
        "kvtransit-decode-0"
    assert all(m["spec"]["selector"]["namespaces"] == ["chaos-ns"] for m in built.values() if m["kind"] != "Job")


def test_rate_collapse_is_two_percent_of_the_scaled_link():
    scenario = chaos.chaos_scenario()
    rate_bits = int(collapsed_bandwidth(scenario)["rate"].removesuffix("bit"))
    goodput = scenario.scaled_link.bandwidth_Bps * RATE_COLLAPSE_SHARE
    assert rate_bits == round(wire_rate_Bps(goodput, DEFAULT_MTU) * 8)
    assert RATE_COLLAPSE_SHARE == 0.02


def test_the_middlebox_s_own_faults_are_put_through_its_control_api(built):
    for name, (fault, body, seconds) in CONTROL_FAULTS.items():
        command = built[name]["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[3:] == [f"http://kvtransit-middlebox:9200/faults/{fault}", json.dumps(body),
                               repr(float(seconds))]
    probe = built["malformed-peer"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert probe[:3] == ["kvtransit", "chaos", "malformed-peer"]


def test_chaos_render_writes_the_experiments_and_a_user_space_shaped_testbed(tmp_path, capsys):
    args = build_parser().parse_args(["chaos", "--render", "k8s", "--out", str(tmp_path), "--namespace", "c1"])
    assert args.func(args) == 0
    names = sorted(p.stem for p in (tmp_path / "experiments").glob("*.yaml"))
    assert names == sorted(chaos.SCENARIOS)
    assert problems(load_directory(tmp_path)) == []
    middlebox = yaml.safe_load_all((tmp_path / "testbed" / "middlebox.yaml").read_text())
    container = next(iter(middlebox))["spec"]["template"]["spec"]["containers"][0]
    assert "--link-backend" not in container["args"]  # Chaos Mesh's tc would remove the testbed's tbf
    kustomization = yaml.safe_load((tmp_path / "testbed" / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "c1"
    args = build_parser().parse_args(["chaos", "--render", "k8s", "--out", str(tmp_path)])
    with pytest.raises(ConfigError, match="not empty"):
        args.func(args)


def _ledger(tmp_path, records: list[dict]) -> str:
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_check_ledger_passes_a_clean_run_and_fails_a_lost_request(tmp_path, capsys):
    clean = [{"ev": "sent", "id": 1, "output": 1, "prefill": 0},
             {"ev": "tokens", "src": "decode-0", "entries": [[1, 0]]},
             {"ev": "outcome", "id": 1, "outcome": "ok", "reason": None, "t": 1.0}]
    args = build_parser().parse_args(["chaos", "--check-ledger", _ledger(tmp_path, clean), "--json"])
    assert args.func(args) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["passed"] and said["requests"] == 1 and said["lost"] == 0
    lost = [*clean, {"ev": "sent", "id": 2, "output": 1, "prefill": 0}]
    args = build_parser().parse_args(["chaos", "--check-ledger", _ledger(tmp_path, lost)])
    assert args.func(args) == 1
    assert "1 lost" in capsys.readouterr().out


def test_check_ledger_names_a_missing_file(tmp_path):
    args = build_parser().parse_args(["chaos", "--check-ledger", str(tmp_path / "nope.jsonl")])
    with pytest.raises(CliError, match=r"nope\.jsonl"):
        args.func(args)
