"""The tier beyond one host: the KV pool as a role of the compose testbed (its `kvpool` profile) and of the Kubernetes
manifests (a Deployment beside the middlebox's node group), wired as `kvtransit up` wires it (flows/tier/launch.py);
the Swarm stack has none (a stack has no profiles), and no target has a trace file to warm a pool from."""

from __future__ import annotations

from collections.abc import Callable

from kvtransit.flows.tier.section import TierSection
from kvtransit.harness.deploy.flow_deploy import Address, ExtraRole, FlowDeploy
from kvtransit.model.scenario import Scenario

ROLE = "kvpool"
POOL_PORT = 9300  # the middlebox's pool port, as docker-compose.yml gives it (beside 9000 ingress, 9200 control)
# The .env lines that start compose's `kvpool` profile and wire the pool in (docker-compose.yml reads each).
COMPOSE_ENV = {
    "COMPOSE_PROFILES": "kvpool",
    "KVTRANSIT_MIDDLEBOX_POOL_FLAGS": f"--kvpool kvpool:9000 --pool-listen 0.0.0.0:{POOL_PORT}",
    "KVTRANSIT_PREFILL_POOL_FLAGS": f"--kv-pool-via middlebox:{POOL_PORT}",
    "KVTRANSIT_POOL_STATS": ",kvpool:9100",
}


class TierDeploy(FlowDeploy):
    def refuse(self, scenario: Scenario, target: str, what: str) -> str | None:
        tier = TierSection.of(scenario)
        if target == "swarm" and tier.pool:
            return ("the stack has no KV pool (kvpool is a compose profile, and a stack has no profiles): run "
                    "--kv-pool pool with `kvtransit up` or `docker-compose --profile kvpool up`")
        if target == "compose" and tier.pool_warm != "off":
            return ("--pool-warm trace: the compose testbed's kvpool container has no trace file to warm from; run it "
                    "with `kvtransit up`")
        return None

    def roles(self, scenario: Scenario, target: str) -> list[ExtraRole]:
        return [ExtraRole(ROLE, runs_with="middlebox", after="decode")] if TierSection.of(scenario).pool else []

    def flags(self, scenario: Scenario, target: str, role: str, address: Address,
              listen: Callable[[str], str]) -> list[str]:
        if not TierSection.of(scenario).pool:
            return []
        if role == "middlebox":
            return ["--kvpool", address(ROLE, "ingress"), "--pool-listen", listen("pool")]
        if role == "prefill":
            return ["--kv-pool-via", address("middlebox", "pool")]
        return []

    def ports(self, scenario: Scenario, target: str, role: str) -> dict[str, int]:
        return {"pool": POOL_PORT} if role == "middlebox" and TierSection.of(scenario).pool else {}

    def compose_env(self, scenario: Scenario) -> dict[str, str]:
        return dict(COMPOSE_ENV) if TierSection.of(scenario).pool else {}


DEPLOY = TierDeploy()
