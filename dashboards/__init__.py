"""kvtransit's Grafana dashboards: generate.py (needs the `dashboards` extra) and queries.py (stdlib only)."""
