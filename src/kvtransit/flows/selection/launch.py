"""`kvtransit up --kv-placement remote`: how the middlebox reaches decode's and the pool's remote-KV ports, and why
the run stays on loopback.

The pool (the tier's, flows/tier/launch.py) runs beside the middlebox, which reaches its remote-KV port on its own
loopback; each decode's remote-KV port is reached over the shaped link, as its KV port is.
"""

from __future__ import annotations

from kvtransit.harness.up.flow_launch import FlowLaunch, LaunchContext
from kvtransit.harness.up.placement import LOOPBACK
from kvtransit.model.scenario import Scenario


class SelectionLaunch(FlowLaunch):
    def links_refusal(self, scenario: Scenario) -> str | None:
        # Measured (40 requests at 2 req/s, llama3-8b, 32k contexts, eth-100g): through tbf's short queue the remote
        # legs' megabyte frames and the hand-offs lost packets to each other: legs 12x the model, the hand-offs at 45 %
        # of the rate. The user-space link queues both flows on one bucket, as a link does.
        return ("--kv-placement remote: its legs share the decode link on the middlebox's user-space bucket; through "
                "tc's tbf (a short queue) they and the hand-offs lose packets to each other")

    def flags(self, ctx: LaunchContext, role: str, index: int) -> list[str]:
        if role != "middlebox":
            return []
        pool = ctx.ready_lines("kvpool")[0]
        return ["--decode-remote-kv", ctx.addresses("decode", "remote_kv_port"),
                "--kvpool-remote-kv", f"{LOOPBACK}:{pool['remote_kv_port']}"]


LAUNCH = SelectionLaunch()
