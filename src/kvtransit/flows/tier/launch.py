"""`kvtransit up --kv-pool pool`: the KV pool process, and how the middlebox and the prefills reach it.

The pool runs where the middlebox runs (its network namespace in netns mode: the middlebox reaches it on its own
loopback, and the pool link's time is the middlebox's to model, not a real NIC's), started once the decodes are up
and before the middlebox that dials it. The middlebox is told the pool's address and opens a pool port for the
prefills (`--kvpool`, `--pool-listen`); each prefill is told that port (`--kv-pool-via`). A pool that warms from a
trace (`--pool-warm trace`) makes its blocks before it says it is ready, so it is given more time.
"""

from __future__ import annotations

from kvtransit.flows.tier.section import TierSection
from kvtransit.harness.up.agent_commands import AGENT_MODULE, ANY_PORT
from kvtransit.harness.up.flow_launch import FlowLaunch, LaunchContext
from kvtransit.harness.up.placement import LOOPBACK
from kvtransit.model.scenario import Scenario

# `--pool-warm trace`: the pool makes and compresses the window's warm blocks before it is ready (the deck-scale
# tier preset's ~1,000 llama3-70b blocks at 1/341 took ~10 s with band-keep here; room for a busy box).
POOL_WARM_READY_EXTRA_S = 120.0
ROLE = "kvpool"
RUNS_WITH = "middlebox"


def pool_argv(scenario: Scenario, metrics_host: str, index: int = 0) -> list[str]:
    """The pool's command: the scenario's flags, any free port (the middlebox reaches it on its loopback), its
    /metrics where the middlebox's are."""
    return [*AGENT_MODULE, ROLE, *scenario.to_argv(), "--name", f"{ROLE}-{index}", "--listen", ANY_PORT,
            "--metrics-listen", f"{metrics_host}:0"]


class TierLaunch(FlowLaunch):
    STATS_ROLES = (ROLE,)

    def ready_extra_s(self, scenario: Scenario, role: str) -> float:
        return POOL_WARM_READY_EXTRA_S if role == ROLE and TierSection.of(scenario).pool_warm == "trace" else 0.0

    async def after(self, ctx: LaunchContext, role: str) -> None:
        if role == "decode" and TierSection.of(ctx.scenario).pool:
            await ctx.start(f"{ROLE}-0", ROLE, ctx.wrap(RUNS_WITH, pool_argv(ctx.scenario, ctx.host(RUNS_WITH))),
                            place=RUNS_WITH)

    def flags(self, ctx: LaunchContext, role: str, index: int) -> list[str]:
        if not TierSection.of(ctx.scenario).pool:
            return []
        if role == "middlebox":
            pool = ctx.ready_lines(ROLE)[0]
            return ["--kvpool", f"{LOOPBACK}:{pool['listen_port']}", "--pool-listen", f"{ctx.host(RUNS_WITH)}:0"]
        if role == "prefill":
            return ["--kv-pool-via", ctx.addresses("middlebox", "pool_port")]
        return []


LAUNCH = TierLaunch()
