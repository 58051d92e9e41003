"""kvtransit past one machine: the testbed, its chaos and its sweeps as Kubernetes manifests.

The manifests are plain dicts built by pure functions, one module per job:

- `naming`: names, labels and ports every manifest agrees on (the compose testbed's ports).
- `scenario_configmap`: the scenario as a ConfigMap that round-trips to the same `Scenario`, and the agents'
  scenario flags read from it.
- `placement`: anti-affinity (required or preferred), node selectors, the check that a scenario fits `--nodes`.
- `testbed`: one workload per role and its Service (`kvtransit k8s render`).
- `monitoring`: the ServiceMonitor, the Grafana dashboards and datasource as ConfigMaps.
- `chaos_mesh`: each `kvtransit chaos` scenario as a Chaos Mesh experiment or a Job (`kvtransit chaos --render k8s`).
- `sweep_job`, `sweep_logs`: a sweep as an Indexed Job, and its pods' logs gathered into a local results file
  (`kvtransit sweep --render k8s`, `--run-point`, `--collect`).
- `yaml_text` (YAML out of plain data), `bundle` (a kustomize base on disk), `render` (the entry points that read
  and write), `validate` (the offline schema checks the tests run).
"""
