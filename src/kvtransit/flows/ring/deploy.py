"""Ring attention beyond one host: not yet (a prefill there is one process, a pod or a container, with no ring's
follower ranks beside it; `kvtransit up` starts them: flows/ring/launch.py)."""

from __future__ import annotations

from kvtransit.flows.ring.section import RingSection
from kvtransit.harness.deploy.flow_deploy import FlowDeploy
from kvtransit.model.scenario import Scenario


class RingDeploy(FlowDeploy):
    def refuse(self, scenario: Scenario, target: str, what: str) -> str | None:
        return (f"--ring-share {RingSection.of(scenario).ring_share:g}: {what} runs one process a prefill "
                "instance, with no ring's follower ranks beside it; run it with `kvtransit up`, or leave --ring-share "
                "at 0")


DEPLOY = RingDeploy()
