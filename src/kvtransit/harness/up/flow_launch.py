"""What a flow starts in `kvtransit up`, and what it tells the core's processes (a flow's `launch.py`: LAUNCH).

The launcher starts the core's processes in one order (decodes, then the middlebox, then prefills, then the client:
each knows its peers' ports before it dials them) and asks every enabled flow, at each point, what it adds:

- `before(ctx, role, index)`: processes beside instance `index` of a core role, started before it (a TP group's
  follower ranks and switch, a ring's followers), and the argv words that tell it about them (`--tp-group JSON`);
- `after(ctx, role)`: processes of the flow's own once every instance of `role` is up (the tier's KV pool, after the
  decodes and before the middlebox that reaches it);
- `flags(ctx, role, index)`: flags for a core role's argv from what is up by then (the middlebox's `--kvpool`, a
  prefill's `--kv-pool-via`);
- `check(ctx)`: refusals before anything starts (a ring with the OpenAI front end); `extra_processes` /
  `too_many`: its share of the host's room for rank processes (harness/host.py), the launcher summing every flow's;
- `links_refusal(scenario)`: why network namespaces and tc cannot carry it (then the run is placed on loopback);
- `ready_extra_s(scenario, role)`: more time for a process of its own to say it is ready (a pool that warms);
- `GROUP_ROLES`: its processes whose exit fails their group (the leader fails the requests it takes with the
  reason), not the run; `STATS_ROLES`: its processes whose /stats join the run report.

Every default does nothing, so a flow answers only what it changes.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Protocol

from kvtransit.model.scenario import Scenario


class LaunchContext(Protocol):
    """The launcher as a flow sees it."""

    scenario: Scenario
    frontend: Any  # the OpenAI front end's options, or None
    restart_roles: tuple[str, ...]

    async def start(self, name: str, role: str, argv: list[str], *, place: str) -> dict[str, Any]:
        """Start `argv` as a child named `name` where `place` (a core role) runs; its readiness line."""
        ...

    def wrap(self, place: str, argv: list[str]) -> list[str]:
        """`argv` as run where `place` runs (its network namespace in netns mode)."""
        ...

    def host(self, place: str, socket: str = "front") -> str:
        """Where `place`'s sockets listen ("kv": decode's KV ingress, "front": the rest)."""
        ...

    def ready_lines(self, role: str) -> list[dict[str, Any]]:
        """The readiness lines of every started child of `role`, in start order."""
        ...

    def addresses(self, role: str, port_key: str) -> str:
        """Every started child of `role`, its `port_key` as the root namespace reaches it, comma-separated."""
        ...


class FlowLaunch:
    GROUP_ROLES: ClassVar[tuple[str, ...]] = ()
    STATS_ROLES: ClassVar[tuple[str, ...]] = ()

    def check(self, ctx: LaunchContext) -> None:
        """Refuse, in one line, a run this flow cannot be part of (before anything starts)."""

    def extra_processes(self, scenario: Scenario) -> int:
        """Rank processes this flow starts beside the core's (the host's room is shared: harness/host.py)."""
        return 0

    def too_many(self, scenario: Scenario, room: int, others: int, cores: int) -> str:
        """The one-line refusal when this flow's processes do not fit the `room` left beside `others` of the other
        flows' (the launcher asks the flow with the most)."""
        return (f"{self.extra_processes(scenario)} more processes ({others} more for other flows); this host has "
                f"{cores} cores, room for {room + others}")

    def links_refusal(self, scenario: Scenario) -> str | None:
        return None

    def ready_extra_s(self, scenario: Scenario, role: str) -> float:
        return 0.0

    async def before(self, ctx: LaunchContext, role: str, index: int) -> list[str]:
        return []

    async def after(self, ctx: LaunchContext, role: str) -> None:
        pass

    def flags(self, ctx: LaunchContext, role: str, index: int) -> list[str]:
        return []


def flow_launches(scenario: Scenario) -> list[FlowLaunch]:
    """The LAUNCH of every flow `scenario` turns on, in registry order (kvtransit/flows/__init__.py)."""
    from kvtransit import flows

    enabled = set(scenario.flows)
    return [launch for name, launch in flows.attribute("launch", "LAUNCH") if name in enabled]


def check_host_room(scenario: Scenario, launches: list[FlowLaunch], cores: int | None = None) -> None:
    """The host's room for the flows' rank processes (harness/host.py: PROCESSES_PER_CORE a core): more than it is
    the one-line refusal of the flow with the most, with the sizes that would fit."""
    from kvtransit.harness.host import PROCESSES_PER_CORE
    from kvtransit.model.errors import ConfigError

    cores = cores or os.cpu_count() or 1
    room = PROCESSES_PER_CORE * cores
    extra = {launch: launch.extra_processes(scenario) for launch in launches}
    if sum(extra.values()) > room:
        most = max(extra, key=lambda launch: extra[launch])
        others = sum(extra.values()) - extra[most]
        raise ConfigError(most.too_many(scenario, room - others, others, cores))
