"""`kvtransit k8s render`: the testbed's manifests validate against the pinned Kubernetes schemas (and the vendored
ServiceMonitor CRD), run the roles the scenario asks for with the right instance counts, carry the scenario in a
ConfigMap that reads back as the same Scenario, and refuse what cannot work (too few nodes, a non-empty --out)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvtransit.cli import OneLineErrorParser, build_parser
from kvtransit.cli import k8s as k8s_cli
from kvtransit.harness.deploy.k8s.naming import COMPONENT, NODE_GROUP
from kvtransit.harness.deploy.k8s.render import base_texts, read_dashboards
from kvtransit.harness.deploy.k8s.scenario_configmap import expand, scenario_data, scenario_from_data
from kvtransit.harness.deploy.k8s.testbed import TestbedOptions, render_testbed
from kvtransit.harness.deploy.k8s.validate import KUBERNETES_VERSION, problems
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_BASE = ROOT / "deploy" / "k8s" / "base"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
FOUR_BY_FOUR = Scenario.build(prefill=4, decode=4, kv_pool="pool", gpus=4)


def _k8s_parser() -> argparse.ArgumentParser:
    """`kvtransit` with the k8s subcommand registered (whether or not cli/__init__.py lists it yet)."""
    parser = OneLineErrorParser(prog="kvtransit")
    sub = parser.add_subparsers(dest="command", parser_class=OneLineErrorParser)
    k8s_cli.register(sub)
    return parser


def _documents(texts: dict[str, str]) -> list[dict]:
    return [doc for text in texts.values() if text.lstrip("#").strip() for doc in yaml.safe_load_all(text) if doc]


def _texts(scenario: Scenario, **options) -> dict[str, str]:
    return base_texts(scenario, TestbedOptions(**options), dashboards=read_dashboards(ROOT / "dashboards" / "json"))


def _workloads(documents: list[dict]) -> dict[str, dict]:
    return {doc["metadata"]["labels"][COMPONENT]: doc for doc in documents if doc["kind"] in WORKLOAD_KINDS}


@pytest.mark.parametrize("scenario,options", [
    (Scenario(), {}),
    (FOUR_BY_FOUR, {"preferred_affinity": True, "node_selector": {"pool": "kv"}, "role_nodes": True}),
    (Scenario.build(kv_pool="pool"), {"link_shaper": "userspace", "nodes": 4}),
], ids=["default", "4p4d-pool-preferred", "pool-userspace"])
def test_rendered_manifests_validate_against_the_pinned_schemas(scenario, options):
    documents = _documents(_texts(scenario, **options))
    assert problems(documents) == [], f"Kubernetes {KUBERNETES_VERSION}"
    assert {doc["kind"] for doc in documents} >= {"Namespace", "ConfigMap", "StatefulSet", "Deployment", "Job",
                                                  "Service", "ServiceMonitor", "PersistentVolumeClaim", "Pod"}


def test_the_validator_refuses_a_field_its_kind_does_not_have():
    documents = _documents(_texts(Scenario()))
    middlebox = next(doc for doc in documents if doc["kind"] == "Deployment")
    middlebox["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"  # a typo
    monitor = next(doc for doc in documents if doc["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intreval"] = "1s"
    found = problems(documents)
    assert len(found) == 2
    assert "imagePulPolicy" in found[0] and "intreval" in found[1]


def test_a_4p4d_scenario_renders_one_workload_per_role_with_its_instance_counts():
    workloads = _workloads(_documents(_texts(FOUR_BY_FOUR)))
    assert set(workloads) == {"prefill", "decode", "middlebox", "kvpool", "loadgen"}
    assert {role: (w["kind"], w["spec"].get("replicas")) for role, w in workloads.items()} == {
        "prefill": ("StatefulSet", 4), "decode": ("StatefulSet", 4), "middlebox": ("Deployment", 1),
        "kvpool": ("Deployment", 1), "loadgen": ("Job", None)}
    loadgen_args = workloads["loadgen"]["spec"]["template"]["spec"]["containers"][0]["args"]
    prefills = loadgen_args[loadgen_args.index("--prefill") + 1].split(",")
    decodes = loadgen_args[loadgen_args.index("--decode-clients") + 1].split(",")
    assert prefills == [f"kvtransit-prefill-{i}.kvtransit-prefill:9000" for i in range(4)]
    assert decodes == [f"kvtransit-decode-{i}.kvtransit-decode:9001" for i in range(4)]


def test_a_scenario_without_a_pool_renders_no_pool():
    assert "kvpool" not in _workloads(_documents(_texts(Scenario())))


def test_the_scenario_configmap_round_trips_to_the_same_scenario():
    scenario = Scenario(prefill=2, decode=3, codec="fp8", rate=7.25, precision_bits=12, transform_charged=True,
                        scale=0.125, module_budget=2.5, kernel_file="", prompt_mean=1000.5)
    configmap = next(doc for doc in _documents(_texts(scenario))
                     if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "kvtransit-scenario")
    assert scenario_from_data(configmap["data"]) == scenario
    assert scenario_from_data(scenario_data(Scenario())) == Scenario()


def test_a_configmap_missing_a_field_is_refused_naming_it():
    data = scenario_data(Scenario())
    del data["rate"]
    with pytest.raises(ConfigError, match="missing rate"):
        scenario_from_data(data)


@pytest.mark.parametrize("role", ["prefill", "middlebox", "decode", "loadgen", "kvpool"])
def test_each_pod_runs_its_role_with_the_configmap_scenario(role):
    """The kubelet expands $(VAR) from the ConfigMap; the role's own parser then reads the same Scenario."""
    documents = _documents(_texts(FOUR_BY_FOUR))
    data = next(doc["data"] for doc in documents if doc["metadata"]["name"] == "kvtransit-scenario")
    container = _workloads(documents)[role]["spec"]["template"]["spec"]["containers"][0]
    argv = expand(container["args"], {**data})
    assert argv[:2] == ["kvtransit", role]
    argv = [a.replace("$(POD_NAME)", f"{role}-0") for a in argv]
    args = vars(build_parser().parse_args(argv[1:]))
    parsed = Scenario.build(**{k.removeprefix("scenario_"): v for k, v in args.items()
                         if k.startswith("scenario_") and k != "scenario_flags"})
    assert parsed == FOUR_BY_FOUR


def test_the_middlebox_shapes_its_egress_with_tc_unless_told_otherwise():
    def middlebox(**options):
        return _workloads(_documents(_texts(Scenario(), **options)))["middlebox"]["spec"]["template"]["spec"][
            "containers"][0]

    tc, userspace = middlebox(), middlebox(link_shaper="userspace")
    assert tc["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"]
    assert {"name": "KVTRANSIT_SHAPE_TO", "value": "kvtransit-decode-0.kvtransit-decode"} in tc["env"]
    assert tc["args"][-2:] == ["--link-backend", "tc"]
    assert "add" not in userspace["securityContext"]["capabilities"]
    assert "--link-backend" not in userspace["args"]


def test_roles_keep_to_nodes_of_their_own_and_the_pool_joins_the_middlebox():
    workloads = _workloads(_documents(_texts(FOUR_BY_FOUR)))
    groups = {role: w["spec"]["template"]["metadata"]["labels"][NODE_GROUP] for role, w in workloads.items()}
    assert groups == {"prefill": "prefill", "decode": "decode", "middlebox": "middlebox", "kvpool": "middlebox",
                      "loadgen": "loadgen"}
    decode = workloads["decode"]["spec"]["template"]["spec"]["affinity"]
    required = decode["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert {"key": NODE_GROUP, "operator": "NotIn", "values": ["decode"]} in required["labelSelector"][
        "matchExpressions"]
    pool = workloads["kvpool"]["spec"]["template"]["spec"]["affinity"]
    assert pool["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"][
        "matchLabels"][COMPONENT] == "middlebox"
    preferred = _workloads(_documents(_texts(FOUR_BY_FOUR, preferred_affinity=True)))["decode"]
    anti = preferred["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"] == required


def test_too_few_nodes_for_required_anti_affinity_is_refused_offering_the_preferred_variant():
    with pytest.raises(ConfigError, match=r"--nodes 3: .* needs 4 nodes .* --preferred-affinity"):
        render_testbed(FOUR_BY_FOUR, TestbedOptions(nodes=3))
    render_testbed(FOUR_BY_FOUR, TestbedOptions(nodes=4))  # the pool shares the middlebox's node
    render_testbed(FOUR_BY_FOUR, TestbedOptions(nodes=2, preferred_affinity=True))


def test_a_scenario_reading_a_file_of_this_host_is_refused():
    with pytest.raises(ConfigError, match=r"--trace t\.jsonl: the k8s testbed runs in pods"):
        render_testbed(Scenario(trace="t.jsonl"), TestbedOptions())


def test_render_refuses_a_directory_that_is_not_empty_unless_forced(tmp_path, capsys):
    out = tmp_path / "base"
    out.mkdir()
    (out / "mine.yaml").write_text("keep me\n")
    parser = _k8s_parser()
    args = parser.parse_args(["k8s", "render", "--out", str(out)])
    with pytest.raises(ConfigError, match=r"--out .*base: not empty \(mine.yaml\).*--force"):
        args.func(args)
    args = parser.parse_args(["k8s", "render", "--out", str(out), "--force", "--decode-instances", "2"])
    assert args.func(args) == 0
    assert (out / "mine.yaml").read_text() == "keep me\n"
    assert (out / "kustomization.yaml").is_file() and (out / "decode.yaml").is_file()
    assert "2 decode" in capsys.readouterr().out


def test_the_cli_says_too_few_nodes_in_one_line(tmp_path, capsys):
    parser = _k8s_parser()
    args = parser.parse_args(["k8s", "render", "--out", str(tmp_path / "x"), "--nodes", "2"])
    with pytest.raises(ConfigError, match="--preferred-affinity"):
        args.func(args)
    assert not (tmp_path / "x").exists()


def test_the_committed_base_is_what_render_writes_for_the_default_scenario():
    """deploy/k8s/base is `kvtransit k8s render --out deploy/k8s/base` (re-render it after changing the renderer)."""
    expected = _texts(Scenario())
    committed = {p.relative_to(COMMITTED_BASE).as_posix(): p.read_text() for p in COMMITTED_BASE.rglob("*.yaml")}
    assert committed == expected


@pytest.mark.slow  # starts a process
def test_kustomize_builds_the_committed_base():
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not on PATH (it carries kustomize)")
    done = subprocess.run(["kubectl", "kustomize", str(COMMITTED_BASE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    built = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert {doc["metadata"].get("namespace") for doc in built if doc["kind"] != "Namespace"} == {"kvtransit"}
    assert problems(built) == []
