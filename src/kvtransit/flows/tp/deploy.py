"""TP groups beyond one host: not yet (a prefill or decode there is one process, a pod or a container, with no TP
group's follower ranks beside it; `kvtransit up` starts them: flows/tp/launch.py)."""

from __future__ import annotations

from kvtransit.harness.deploy.flow_deploy import FlowDeploy
from kvtransit.model.scenario import Scenario, flag_for


class TpDeploy(FlowDeploy):
    def refuse(self, scenario: Scenario, target: str, what: str) -> str | None:
        name = "prefill_tp" if scenario.prefill_tp > 1 else "decode_tp"
        return (f"{flag_for(name)} {getattr(scenario, name)}: {what} runs one process an instance, with no "
                f"TP group's follower ranks beside it; run it with `kvtransit up`, or leave {flag_for(name)} at 1")


DEPLOY = TpDeploy()
