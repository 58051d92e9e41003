"""Remote KV beyond one host: not wired yet on any target (the middlebox relays between decode's and the pool's
remote-KV ports, which only `kvtransit up` connects: flows/selection/launch.py)."""

from __future__ import annotations

from kvtransit.harness.deploy.flow_deploy import FlowDeploy
from kvtransit.model.scenario import Scenario


class SelectionDeploy(FlowDeploy):
    def refuse(self, scenario: Scenario, target: str, what: str) -> str | None:
        return (f"--kv-placement remote: {what} has no wiring for remote KV's legs (decode's and the pool's "
                "remote-KV ports, which the middlebox relays between); run it with `kvtransit up`, or leave "
                "--kv-placement at local")


DEPLOY = SelectionDeploy()
