"""Checks rendered manifests against published schemas, offline: Kubernetes' own kinds with kubernetes-validate
(its bundled OpenAPI schemas, strict: an unknown field is an error) at a pinned Kubernetes version, and the custom
resources (Chaos Mesh's NetworkChaos and PodChaos, the Prometheus Operator's ServiceMonitor) with jsonschema
against their CRDs' openAPIV3Schema, vendored under deploy/crds/ (its README names each file's source).

A CRD's schema lets unknown fields through (the API server prunes them silently), so a typo would pass; here every
object whose schema lists its properties is closed (additionalProperties: false) unless the schema says it keeps
unknown fields: a manifest that says more than its kind knows is refused, as kubernetes-validate's strict mode does.

Needs the `test` extra (kubernetes-validate, which brings jsonschema and PyYAML): imported when called.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

from kvtransit.paths import REPO

# The Kubernetes release the manifests are written for and checked against: the oldest release still maintained
# upstream when this was written (1.33, with 1.34 and 1.35), and the first with per-index retries
# (Job.spec.backoffLimitPerIndex) generally available, which the sweep's Indexed Job uses.
KUBERNETES_VERSION = "1.33.0"
CRD_DIR = REPO / "deploy" / "crds"
# (apiVersion, kind) → the vendored CRD file holding its schema.
CRD_FILES = {
    ("chaos-mesh.org/v1alpha1", "NetworkChaos"): "chaos-mesh.org_networkchaos.yaml",
    ("chaos-mesh.org/v1alpha1", "PodChaos"): "chaos-mesh.org_podchaos.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}
# Not a Kubernetes object: the kustomize base's own file, checked for its shape only.
KUSTOMIZATION_KIND = ("kustomize.config.k8s.io/v1beta1", "Kustomization")


def _where(document: dict) -> str:
    return f"{document.get('kind', '?')}/{(document.get('metadata') or {}).get('name', '?')}"


def crd_schema(api_version: str, kind: str, crd_dir: Path = CRD_DIR) -> dict:
    """The closed openAPIV3Schema of a vendored CRD's version."""
    import yaml  # type: ignore[import-untyped]

    group, _, version = api_version.partition("/")
    crd = yaml.safe_load((crd_dir / CRD_FILES[(api_version, kind)]).read_text(encoding="utf-8"))
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind, (api_version, kind)
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    return closed(served[version]["schema"]["openAPIV3Schema"])


def closed(schema: dict) -> dict:
    """A copy of the schema where every object listing its properties refuses others (see the module docstring)."""
    schema = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def problems(documents: Iterable[dict], *, version: str = KUBERNETES_VERSION, crd_dir: Path = CRD_DIR) -> list[str]:
    """One line per manifest that does not validate (empty: all do). A kind with no schema at all is a problem too:
    nothing goes unchecked silently."""
    import jsonschema  # type: ignore[import-untyped]
    import kubernetes_validate  # type: ignore[import-untyped]

    found: list[str] = []
    schemas: dict[tuple[str, str], dict] = {}
    for document in documents:
        ident = (document.get("apiVersion", ""), document.get("kind", ""))
        if ident == KUSTOMIZATION_KIND:
            if not isinstance(document.get("resources"), list):
                found.append(f"{_where(document)}: no resources list")
            continue
        if ident in CRD_FILES:
            if ident not in schemas:
                schemas[ident] = crd_schema(*ident, crd_dir=crd_dir)
            validator = jsonschema.Draft7Validator(schemas[ident])
            found += [f"{_where(document)}: {'.'.join(map(str, error.path)) or '(top)'}: {error.message}"
                      for error in validator.iter_errors(document)]
            continue
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            found.append(f"{_where(document)}: {'.'.join(map(str, error.path)) or '(top)'}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            found.append(f"{_where(document)}: no schema ({error.message})")
    return found


def load_directory(directory: Path) -> list[dict]:
    """Every document of every .yaml file under `directory`."""
    import yaml

    documents = []
    for path in sorted(Path(directory).rglob("*.yaml")):
        documents += [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    return documents
