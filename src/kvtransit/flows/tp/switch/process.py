"""The switch as a process: `kvtransit middlebox --placement switch --ranks N` (cli/middlebox.py), which is also how
`kvtransit collective --allreduce switch` starts it (flows/tp/run.py).

It binds the ranks' port and the HTTP side (/metrics with `switch_merged_streams_total`, /stats), prints the
readiness line (listen_port, metrics_port), serves one group until every rank said BYE, the collective failed, or
it is stopped, then prints one `KVTRANSIT-RESULT {json}` line (SwitchServer.stats) and exits.

`kvtransit middlebox --placement switch --ranks N` is the core's middlebox command reaching this flow through the
registry (flows/tp/cli.py: STREAM_SUM, i.e. switch/cli.py: `serve_stream_sum` and the flags it adds).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, fields
from typing import Any

from kvtransit.agents.process import Address, announce_result, new_registry, port_in_use_error
from kvtransit.agents.skeleton import AgentContext
from kvtransit.flows.tp.metrics import switch_metrics
from kvtransit.flows.tp.switch.server import SwitchServer
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import KernelDeclaration, Module
from kvtransit.runtime.clock import MonotonicClock
from kvtransit.runtime.group_link.timing import RANK_SPIN_S
from kvtransit.wire.group import U32

# After the group is done: let the last ABORTs or BYEs flush before the connections close.
FLUSH_S = 0.05


@dataclass(frozen=True)
class SwitchConfig:
    """The switch's group and its ports, as `kvtransit collective` plans them: `rate_Bps`, `latency_s` and
    `module_latency_s` already scaled and stretched by the dilation; `scale` = real bytes / model bytes."""

    group: int
    size: int
    rate_Bps: float
    latency_s: float
    module_ops_per_byte: float
    module_latency_s: float
    module_pj_per_bit: float
    scale: float = 1.0
    deadline_s: float = 60.0
    collectives: int = 0  # all-reduces a step (0: unknown), to name the next one in a failure
    idle_s: float = 0.0  # how long a rank may be silent between collectives (0: deadline_s; a serving group idles)

    def __post_init__(self) -> None:
        def integer(name: str, lo: int, hi: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ConfigError(f"switch config: {name} must be an integer in {lo}..{hi}, got {value!r}")

        def number(name: str, *, positive: bool) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (positive and value == 0):
                raise ConfigError(f"switch config: {name} must be a finite number {'> 0' if positive else '>= 0'}, "
                                  f"got {value!r}")

        integer("group", 0, U32)
        integer("size", 2, 2**16 - 1)  # a rank is a u16 on the wire (wire/group.py)
        integer("collectives", 0, U32)
        for name in ("rate_Bps", "module_ops_per_byte", "scale", "deadline_s"):
            number(name, positive=True)
        for name in ("latency_s", "module_latency_s", "module_pj_per_bit", "idle_s"):
            number(name, positive=False)
        if self.scale > 1:
            raise ConfigError(f"switch config: scale must be in (0, 1], got {self.scale!r}")

    @property
    def module(self) -> Module:
        return Module(ops_per_byte=self.module_ops_per_byte, pj_per_input_bit=self.module_pj_per_bit,
                      added_latency_s=self.module_latency_s)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], defaults: dict[str, Any]) -> SwitchConfig:
        """`defaults` overridden by `data` (the `--switch-config` JSON); an unknown key is refused by name."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"switch config: unknown key {unknown[0]!r} (keys: {', '.join(known)})")
        return cls(**{**defaults, **data})


class SwitchProcess:
    """The switch on the skeleton's lifecycle (agents/skeleton.py): its one main loop is the group's, and it ends
    when the group is done; the result line goes out once the switch has closed."""

    role = "switch"
    parts: tuple = ()

    def __init__(self, config: SwitchConfig, declaration: KernelDeclaration, *, name: str, listen: Address,
                 metrics_listen: Address):
        """`declaration`: the kernel the sum runs as, already checked (kernel_check.check_switch_kernel)."""
        self.registry, _shared = new_registry("switch")
        self.server = SwitchServer(
            MonotonicClock(spin_s=RANK_SPIN_S), group=config.group, size=config.size, rate_Bps=config.rate_Bps,
            latency_s=config.latency_s, module=config.module, scale=config.scale, deadline_s=config.deadline_s,
            collectives=config.collectives, declaration=declaration, metrics=switch_metrics(self.registry),
            idle_s=config.idle_s)
        self.name = name
        self.listen_address = listen
        self.metrics_listen = metrics_listen

    def stats(self) -> dict[str, Any]:
        return self.server.stats()

    async def start(self, ctx: AgentContext) -> None:
        try:
            port = await self.server.start(self.listen_address.host, self.listen_address.port)
        except OSError as exc:
            raise port_in_use_error(self.listen_address, "--listen", exc) from None
        ctx.announce(listen_port=port, placement="switch")

    def main_loops(self) -> dict[str, Any]:
        return {"group": self.server.done.wait()}  # every rank said BYE, or the collective failed

    async def stopping(self) -> None:
        await asyncio.sleep(FLUSH_S)  # the last ABORTs or BYEs flush before the connections close
        await self.server.close()
        announce_result(self.server.stats())
