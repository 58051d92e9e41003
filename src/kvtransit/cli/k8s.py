"""`kvtransit k8s`: the testbed on Kubernetes.

    kvtransit k8s render --out deploy/mine --prefill-instances 4 --decode-instances 4 --nodes 6
    kubectl apply -k deploy/mine                 # a kustomize base: namespace, image and patches in an overlay
    kvtransit k8s validate deploy/mine           # offline, against the pinned Kubernetes and the vendored CRDs

`render` writes one workload per role (prefill and decode StatefulSets behind headless Services, the middlebox
and the KV pool as Deployments, the load generator as a Job), the scenario as a ConfigMap every pod reads its
flags from, the middlebox shaping its egress with tc (NET_ADMIN) as the compose testbed does, pod anti-affinity
so that roles land on different nodes (required; --preferred-affinity lets the scheduler share nodes), Prometheus
scrape annotations and a ServiceMonitor, and the Grafana dashboards as ConfigMaps for Grafana's sidecar. The
scenario flags are `kvtransit up`'s. deploy/k8s/README.md says how to run it and read the results.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtransit.cli._common import CliError
from kvtransit.cli.scenario_flags import add_scenario_args, scenario_from_args


def add_placement_flags(parser: argparse.ArgumentParser, *, what: str = "the testbed") -> None:
    """The flags every k8s render shares (k8s render, chaos --render k8s, sweep --render k8s)."""
    from kvtransit.harness.deploy.k8s.naming import DEFAULT_IMAGE, DEFAULT_NAME, DEFAULT_NAMESPACE

    g = parser.add_argument_group("Kubernetes (with --render k8s)" if what != "the testbed" else "Kubernetes")
    g.add_argument("--image", default=DEFAULT_IMAGE, metavar="IMAGE",
                   help=f"the agents' image (default {DEFAULT_IMAGE}, the compose file's)")
    g.add_argument("--name", dest="k8s_name", default=DEFAULT_NAME, metavar="NAME",
                   help=f"the instance name every resource starts with (default {DEFAULT_NAME})")
    g.add_argument("--namespace", default=DEFAULT_NAMESPACE, metavar="NS",
                   help=f"the namespace, set by the kustomization (default {DEFAULT_NAMESPACE})")
    g.add_argument("--nodes", type=int, default=None, metavar="N",
                   help=f"the cluster's nodes for {what}: checked against required anti-affinity (default: not "
                        "checked)")
    g.add_argument("--preferred-affinity", action="store_true",
                   help="keep pods apart only where the scheduler can (preferred anti-affinity) instead of refusing "
                        "to schedule them together (required)")
    g.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                   help="only nodes with this label (repeat), e.g. nodes set aside for the testbed")
    g.add_argument("--force", action="store_true", help="render into a directory that is not empty")


def node_selector(items: list[str]) -> dict[str, str]:
    selector = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--node-selector: expected KEY=VALUE, got {item!r}")
        selector[key] = value
    return selector


def cluster_options(args, *, link_shaper: str | None = None):
    from kvtransit.harness.deploy.k8s.testbed import TestbedOptions

    return TestbedOptions(name=args.k8s_name, namespace=args.namespace, image=args.image, nodes=args.nodes,
                          preferred_affinity=args.preferred_affinity, node_selector=node_selector(args.node_selector),
                          role_nodes=getattr(args, "role_nodes", False),
                          link_shaper=str(link_shaper or getattr(args, "link_shaper", "tc")))


def register(subparsers) -> None:
    from kvtransit.harness.deploy.k8s.monitoring import DASHBOARDS_DIR, DEFAULT_PROMETHEUS_URL
    from kvtransit.harness.deploy.k8s.testbed import LINK_SHAPERS
    from kvtransit.harness.deploy.k8s.validate import KUBERNETES_VERSION

    p = subparsers.add_parser("k8s", help="the testbed on Kubernetes: render manifests, validate them",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="k8s_command", metavar="ACTION", parser_class=type(p))
    sub.required = True
    r = sub.add_parser("render", help="write the testbed's manifests (a kustomize base) for a scenario",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the base goes (empty, or --force)")
    add_placement_flags(r)
    r.add_argument("--role-nodes", action="store_true",
                   help="each role only on nodes labelled kvtransit.io/role=ROLE (the KV pool with the middlebox)")
    r.add_argument("--link-shaper", choices=LINK_SHAPERS, default="tc",
                   help="what shapes the middlebox -> decode rate: tc on the middlebox's egress (NET_ADMIN, as "
                        "compose; default) or the middlebox's own token bucket (what Chaos Mesh's tc faults need)")
    r.add_argument("--dashboards", type=Path, default=DASHBOARDS_DIR, metavar="DIR",
                   help="the generated Grafana dashboards (default the repository's dashboards/json)")
    r.add_argument("--prometheus-url", default=DEFAULT_PROMETHEUS_URL, metavar="URL",
                   help=f"the Prometheus the dashboards' datasource reads (default {DEFAULT_PROMETHEUS_URL})")
    add_scenario_args(r)
    r.set_defaults(func=run_render)
    v = sub.add_parser("validate", help="check rendered manifests offline against the pinned schemas",
                       description="Every document of every .yaml file under DIR, against Kubernetes "
                                   f"{KUBERNETES_VERSION}'s schemas (kubernetes-validate, strict) and the vendored "
                                   "CRDs (deploy/crds/). Needs the test extra.")
    v.add_argument("directory", type=Path, metavar="DIR")
    v.add_argument("--kubernetes-version", default=KUBERNETES_VERSION, metavar="X.Y.Z",
                   help=f"(default {KUBERNETES_VERSION})")
    v.set_defaults(func=run_validate)


def run_render(args) -> int:
    from kvtransit.harness.deploy.k8s.render import write_testbed
    from kvtransit.harness.deploy.k8s.testbed import roles

    scenario = scenario_from_args(args)
    written = write_testbed(args.out, scenario, cluster_options(args), force=args.force,
                            dashboards_dir=args.dashboards, prometheus_url=args.prometheus_url)
    present = roles(scenario)
    print(f"kvtransit k8s: {len(written)} files in {args.out} ({', '.join(present)}; "
          f"{scenario.prefill} prefill, {scenario.decode} decode)")
    print(f"  kubectl apply -k {args.out}")
    print("  note: the agents still pass CLOCK_MONOTONIC stamps between hosts; roles on different nodes are not "
          "faithful yet (docs/scale.md, 'Clocks')")
    return 0


def run_validate(args) -> int:
    from kvtransit.harness.deploy.k8s.validate import load_directory, problems

    try:
        documents = load_directory(args.directory)
        found = problems(documents, version=args.kubernetes_version)
    except ImportError as exc:
        raise CliError(f"validate needs kubernetes-validate (the test extra: pip install 'kvtransit[test]'): "
                       f"{exc}") from None
    for line in found:
        print(line)
    print(f"{len(documents)} manifests, {len(found)} problems (Kubernetes {args.kubernetes_version})")
    return 1 if found else 0
