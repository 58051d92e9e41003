"""A weight flow's role process: `python -m kvtransit.flows.weights --config JSON` (flows/weights/run.py).

A run-to-end process (agents/run_to_end.py): the store binds the instance's connection; the instance's go line is
{"store": [host, port], "start_ns": ...}; both join, run, and print their result line.
Config: {"role": "store" | "instance", "plan": WeightsPlan fields, "rate_Bps", "latency_s"}.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from kvtransit.agents.run_to_end import run_config_process, run_to_end
from kvtransit.flows.weights import content
from kvtransit.flows.weights.roles import (
    GROUP,
    ROLE_INSTANCE,
    ROLE_NAMES,
    ROLE_STORE,
    InstanceResult,
    StoreResult,
    WeightsPlan,
    run_instance,
    serve_store,
    weights_at_rest,
)
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.channel import Channel
from kvtransit.runtime.group_link.connect import PeerListener, Seat, dial_member
from kvtransit.runtime.group_link.timing import RANK_SPIN_S


async def role_main(config: dict[str, Any], stop: asyncio.Event) -> None:
    role = str(config["role"])
    plan = WeightsPlan(**{**config["plan"], "arrivals_s": tuple(config["plan"]["arrivals_s"]),
                          "adapters": tuple(config["plan"]["adapters"])})
    rate, latency = float(config["rate_Bps"]), float(config["latency_s"])
    clock = MonotonicClock(spin_s=RANK_SPIN_S)
    rank = {"store": ROLE_STORE, "instance": ROLE_INSTANCE}[role]
    seat = Seat(GROUP, rank, len(ROLE_NAMES), plan.deadline_s)
    listener = PeerListener() if rank == ROLE_STORE else None
    port = await listener.listen() if listener is not None else 0
    # The weights (hundreds of MB at some scales) are made before the readiness line, off the run's clock: the
    # store's at rest, the instance's copy to check what arrives against.
    at_rest = weights_at_rest(plan) if rank == ROLE_STORE else {}
    expected = content.weights(plan.weights_bytes) if rank == ROLE_INSTANCE else b""
    channels: list[Channel] = []

    async def play(go: dict[str, Any]) -> StoreResult | InstanceResult:
        if listener is not None:
            channels.append(await listener.channel(seat, clock, ROLE_INSTANCE, ROLE_NAMES[ROLE_INSTANCE],
                                                   rate_Bps=rate, latency_s=latency))
            return await serve_store(plan, channels[0], at_rest)
        channels.append(await dial_member(seat, clock, go["store"], ROLE_STORE, ROLE_NAMES[ROLE_STORE],
                                          rate_Bps=rate, latency_s=latency))
        return await run_instance(plan, clock, channels[0], int(go["start_ns"]), expected)

    async def close() -> None:
        for channel in channels:
            await channel.close()
        if listener is not None:
            await listener.close()

    empty = StoreResult if rank == ROLE_STORE else InstanceResult
    await run_to_end(stop, role=f"weights-{role}", name=role, who=f"the {role}", ports={"listen_port": port},
                     play=play, close=close, failed=lambda reason: empty(ok=False, reason=reason),
                     labels={"role": role})


def main(argv: list[str] | None = None) -> int:
    return run_config_process("python -m kvtransit.flows.weights",
                              "JSON: role, plan (WeightsPlan fields), rate_Bps, latency_s",
                              role_main, argv)


if __name__ == "__main__":
    sys.exit(main())
