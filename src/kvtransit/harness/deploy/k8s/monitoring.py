"""What watches the testbed on a cluster: a ServiceMonitor for the Prometheus Operator, the generated Grafana
dashboards as ConfigMaps for Grafana's sidecar, and the datasource they name.

Prometheus without the Operator finds the pods by their `prometheus.io/*` annotations (testbed.py). Scraping is
every second as in prometheus/prometheus.yml (runs last about a minute), and each target gets the `agent` label
(the pod's role) that the compose and `kvtransit up` targets files give. The dashboards refer to their datasource
by the pinned uid `kvtransit-prometheus` (dashboards/generate.py: DATASOURCE), so a datasource of that uid comes
with them, pointing at the cluster's Prometheus (`--prometheus-url`).
Pure: the dashboards' text is read by the caller (render.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvtransit.harness.deploy.k8s.naming import COMPONENT, INSTANCE, PART_OF, Names
from kvtransit.harness.deploy.k8s.yaml_text import dump
from kvtransit.paths import REPO

# The generated dashboards (dashboards/generate.py writes them here); an installed kvtransit has no checkout, so
# `--dashboards DIR` names a copy.
DASHBOARDS_DIR = REPO / "dashboards" / "json"
# prometheus/prometheus.yml: global.scrape_interval and scrape_timeout.
SCRAPE_INTERVAL = "1s"
# dashboards/generate.py: DATASOURCE (the uid every generated dashboard names).
DATASOURCE_UID = "kvtransit-prometheus"
# The Service the Prometheus Operator makes for every Prometheus it runs, here in a `monitoring` namespace (where
# kube-prometheus puts it); `--prometheus-url` names another.
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
# The labels Grafana's sidecar (k8s-sidecar, as the grafana Helm chart sets it up) watches for.
DASHBOARD_LABEL = "grafana_dashboard"
DATASOURCE_LABEL = "grafana_datasource"


def service_monitor(names: Names) -> dict:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": names.instance, "labels": names.labels("monitoring")},
            "spec": {"selector": {"matchLabels": {INSTANCE: names.instance, PART_OF: "kvtransit"}},
                     "endpoints": [{"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL,
                                    "scrapeTimeout": SCRAPE_INTERVAL,
                                    "relabelings": [{"sourceLabels": [_pod_label(COMPONENT)],
                                                     "targetLabel": "agent", "action": "replace"}]}]}}


def _pod_label(label: str) -> str:
    """Prometheus' service-discovery meta label of a pod label (non-alphanumerics become `_`)."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)


def dashboard_configmaps(names: Names, dashboards: Mapping[str, str]) -> list[dict]:
    """One ConfigMap per dashboard (file name → its JSON text), labelled for Grafana's sidecar."""
    return [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": f"{names.instance}-dashboard-{file_name.removesuffix('.json')}".lower(),
                          "labels": {**names.labels("dashboards"), DASHBOARD_LABEL: "1"},
                          "annotations": {"grafana_folder": "kvtransit"}},
             "data": {file_name: text}}
            for file_name, text in sorted(dashboards.items())]


def datasource_configmap(names: Names, prometheus_url: str) -> dict:
    # The same datasource as dashboards/provisioning/datasources/prometheus.yml, at the cluster's Prometheus.
    provisioning = {"apiVersion": 1, "datasources": [{
        "name": "kvtransit Prometheus", "uid": DATASOURCE_UID, "type": "prometheus", "access": "proxy",
        "url": prometheus_url, "isDefault": False, "editable": False, "jsonData": {"timeInterval": SCRAPE_INTERVAL}}]}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{names.instance}-datasource",
                         "labels": {**names.labels("dashboards"), DATASOURCE_LABEL: "1"}},
            "data": {"kvtransit-datasource.yaml": dump(provisioning)}}
