"""Remote KV's parts in `kvtransit up`'s agents (`--kv-placement remote`).

- **decode** (`DecodeLegsPart`): a step that runs long-context requests first fetches their remote KV (the summaries
  scored in transit, then the chosen pages, or every token) through the middlebox over the decode link, then holds
  its compute at the context attended; a leg that fails fails that step's remote requests with the reason
  (flows/selection/decode_legs.py). It keeps which hand-offs are on the link, so a step whose legs had the link to
  themselves is judged against the model and the others are not.
- **middlebox** (`RelayPart`): relays decode's legs to the pool, scores the summaries that crossed, and stamps every
  answer on the hand-off link's own bucket (flows/selection/middlebox_relay.py).
- **kvpool** (`ContextsPart`): the pool holds the long-context class's contexts and serves them on a second port
  (flows/selection/pool_contexts.py), made ahead of their requests.
"""

from __future__ import annotations

import argparse
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from kvtransit.agents.decode.parts import DecodePart
from kvtransit.agents.process import Address, parse_address, parse_addresses
from kvtransit.agents.skeleton import AgentContext, Part
from kvtransit.agents.stepping import StepFailed
from kvtransit.flows.selection.decode_legs import RemoteKvFailed, RemoteKvLegs
from kvtransit.flows.selection.metrics import remote_kv_metrics
from kvtransit.flows.selection.middlebox_relay import RemoteKvRelay
from kvtransit.flows.selection.pool_contexts import RemoteContextServer
from kvtransit.flows.selection.remote_context import RemoteContexts
from kvtransit.flows.selection.section import SelectionSection
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.clock import DeadlineSchedule

# The hand-offs that left the link recently: enough to tell whether a step's legs met one.
RECENT_HANDOFFS = 256


def add_flags(parser: argparse.ArgumentParser, role: str) -> None:
    if role == "middlebox":
        parser.add_argument("--decode-remote-kv", dest="decode_remote_kv", default=None,
                            metavar="HOST:PORT[,HOST:PORT...]",
                            help="--kv-placement remote: each decode's remote-KV port (its legs to the pool cross the "
                                 "link to it)")
        parser.add_argument("--kvpool-remote-kv", dest="kvpool_remote_kv", default=None, metavar="HOST:PORT",
                            help="--kv-placement remote: the KV pool's remote-KV port")


def components(role: str, agent: Any, args: Mapping[str, Any]) -> list[Part]:
    if role == "decode":
        return [DecodeLegsPart(agent)]
    if role == "middlebox":
        decodes, pool = args.get("decode_remote_kv"), args.get("kvpool_remote_kv")
        if not decodes or not pool:
            raise ConfigError("--kv-placement remote: the middlebox needs --decode-remote-kv and --kvpool-remote-kv "
                              "(decode's and the pool's remote-KV ports); `kvtransit up` wires them, the compose "
                              "testbed does not")
        decodes = decodes if isinstance(decodes, list) else parse_addresses(decodes, "--decode-remote-kv")
        pool = pool if isinstance(pool, Address) else parse_address(pool, "--kvpool-remote-kv")
        return [RelayPart(agent, decodes, pool)]
    if role == "kvpool":
        return [ContextsPart(agent)]
    return []


class DecodeLegsPart(DecodePart):
    name = "remote KV legs"

    def __init__(self, agent: Any):
        self.scenario, self.clock = agent.scenario, agent.clock
        self.selection = SelectionSection.of(self.scenario)
        self.listen_host = agent.listen_address.host
        self.legs = RemoteKvLegs(self.scenario, agent.clock, remote_kv_metrics(agent.registry),
                                 self._handoffs_on_link, agent.link.shared)
        # Hand-offs on the link now (request id -> since, ns) and recently ((since, end) ns): whether a step's remote
        # legs had the link to themselves.
        self._now: dict[int, int] = {}
        self._done: deque[tuple[int, int]] = deque(maxlen=RECENT_HANDOFFS)

    async def start(self, ctx: AgentContext) -> None:
        ctx.announce(remote_kv_port=await self.legs.listen(self.listen_host, 0))  # the middlebox connects here

    def _remote(self, running_ids: Sequence[int]) -> list[int]:
        """The running requests of the long-context class (flows/selection/remote_class.py: in_remote_class)."""
        return [rid for rid in running_ids if self.selection.is_remote_request(self.scenario, rid)]

    def extra_context(self, running_ids: Sequence[int]) -> int:
        remote = self._remote(running_ids)
        return self.legs.attended_tokens(len(remote)) if remote else 0

    async def before_step(self, step: int, running_ids: Sequence[int], schedule: DeadlineSchedule) -> None:
        """The step's remote legs from its due start; the schedule then runs on from when the pages were held: when
        they were due, or later when they came late (the compute cannot start before its KV is here; the lateness is
        the legs', counted there, not the step timer's)."""
        remote = self._remote(running_ids)
        if not remote:
            return
        start_ns = schedule.deadline_ns
        try:
            held_ns = await self.legs.fetch(step, remote, start_ns)
        except RemoteKvFailed as exc:
            raise StepFailed(str(exc), remote) from None
        schedule.add(max(0, held_ns - start_ns) / 1e9)

    def kv_begin(self, request_id: int, now_ns: int, first_token_ns: int) -> None:
        self._now[request_id] = min(now_ns, first_token_ns or now_ns)

    def kv_left_link(self, request_id: int, now_ns: int) -> None:
        since = self._now.pop(request_id, None)
        if since is not None:
            self._done.append((since, now_ns))
            self.legs.met_handoff(request_id, since, now_ns)

    def _handoffs_on_link(self, start_ns: int, end_ns: int) -> bool:
        return (any(since < end_ns for since in self._now.values())
                or any(s < end_ns and start_ns < e for s, e in self._done))

    def stats(self) -> dict[str, Any]:
        return {"remote_kv": {"select": self.selection.select_mode, **self.legs.record.to_json()}}

    async def close(self) -> None:
        await self.legs.close()


class RelayPart(Part):
    name = "remote KV relay"

    def __init__(self, agent: Any, decodes: list[Address], pool: Address):
        self.middlebox = agent.middlebox
        self.relay = RemoteKvRelay(agent.middlebox, [(a.host, a.port) for a in decodes], (pool.host, pool.port),
                                   remote_kv_metrics(agent.registry))

    async def start(self, ctx: AgentContext) -> None:
        self.relay.start()

    def stats(self) -> dict[str, Any]:
        return {"remote_kv": self.relay.stats.to_json(self.middlebox.model_bytes_per_byte)}

    async def close(self) -> None:
        await self.relay.close()


class ContextsPart(Part):
    name = "remote contexts"

    def __init__(self, agent: Any):
        self.scale = agent.scale
        self.listen_address = agent.listen_address
        self.server = RemoteContextServer(RemoteContexts(agent.scenario))

    async def start(self, ctx: AgentContext) -> None:
        await self.server.prepare()
        await ctx.listen_streams(Address(self.listen_address.host, 0), "--listen", self.server.serve,
                                 port_key="remote_kv_port")

    def stats(self) -> dict[str, Any]:
        return {"remote_kv": self.server.stats(1.0 / self.scale)}

    async def close(self) -> None:
        await self.server.close()
