"""The tier's parts in `kvtransit up`'s agents.

- **prefill** (`PrefixPart`): each request's longest cached prefix is looked up (and, with the pool, fetched through
  the middlebox's pool port, `--kv-pool-via`) before it is queued, so its TTFT pays for the fetch; only the rest is
  queued and computed (the step is `model.cost.prefill_step_cached_s`: cached KV re-read, not recomputed); the blocks
  its step computed are written back in the background. A pool that is down, or a fetch that fails, is a recompute
  with the reason counted (flows/tier/prefix_cache.py).
- **middlebox** (`PoolRelayPart`): a pool port for the prefills (`--pool-listen`), whose write-backs go down the
  module's stage chain (compressed once, on the way out) to the KV pool (`--kvpool`) and whose fetches come back
  over the pool link with the module charged the inverse (flows/tier/middlebox_pool.py).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from typing import Any

from kvtransit.agents.prefill.parts import Enqueue, PrefillPart
from kvtransit.agents.process import Address, parse_address
from kvtransit.agents.skeleton import AgentContext, Part
from kvtransit.flows.tier.middlebox_pool import PoolRelay
from kvtransit.flows.tier.prefix_cache import Lookup, PrefixReuse
from kvtransit.flows.tier.section import TierSection
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.tasks import TaskSet
from kvtransit.wire.events import Request, Role

log = logging.getLogger(__name__)

# How long /stats waits for the prefill's write-backs in flight: well inside the shortest /stats reader's timeout
# (the launcher's 2 s; runtime/http_client.py's default is longer), and far longer than a write-back takes.
WRITE_BACK_SETTLE_S = 1.0


def add_flags(parser: argparse.ArgumentParser, role: str) -> None:
    if role == "prefill":
        parser.add_argument("--kv-pool-via", dest="kv_pool_via", default=None, metavar="HOST:PORT",
                            help="with --kv-pool pool: the middlebox's pool port (its --pool-listen), the way to the "
                                 "KV pool")
    elif role == "middlebox":
        parser.add_argument("--kvpool", dest="kvpool", default=None, metavar="HOST:PORT",
                            help="the KV pool behind this middlebox (kvtransit kvpool): prefills fetch and write back "
                                 "prefix blocks through --pool-listen, over the module and the link")
        parser.add_argument("--pool-listen", dest="pool_listen", default="127.0.0.1:0", metavar="HOST:PORT",
                            help="with --kvpool: where prefills reach the pool (default 127.0.0.1:0, any free port)")


def _address(value: Any, flag: str) -> Address | None:
    if value is None or isinstance(value, Address):
        return value
    return parse_address(str(value), flag) if value else None


def components(role: str, agent: Any, args: Mapping[str, Any]) -> list[Part]:
    tier = TierSection.of(agent.scenario)
    if role == "prefill" and tier.kv_pool != "off":
        pool_via = _address(args.get("kv_pool_via"), "--kv-pool-via")
        if tier.pool and pool_via is None:
            raise ConfigError("--kv-pool pool: the prefill needs the middlebox's pool port (--kv-pool-via HOST:PORT; "
                              "`kvtransit up` gives it)")
        return [PrefixPart(agent, pool_via)]
    if role == "middlebox":
        kvpool = _address(args.get("kvpool"), "--kvpool")
        if kvpool is not None:
            return [PoolRelayPart(agent, kvpool, _address(args.get("pool_listen"), "--pool-listen")
                                  or Address("127.0.0.1", 0))]
    return []


class PrefixPart(PrefillPart):
    """The prefill's side of prefix reuse: each request's lookup, kept until its step has run."""

    name = "prefix cache"

    def __init__(self, agent: Any, pool_via: Address | None):
        self.reuse = PrefixReuse(agent.scenario, registry=agent.registry, kv=agent.stager.kv, clock=agent.clock,
                                 pool_via=pool_via, name=agent.name)
        self._lookups: dict[int, Lookup] = {}
        self._tasks = TaskSet(f"{agent.name} lookups")

    def admit(self, request: Request, enqueue: Enqueue) -> bool:
        # Look it up (and fetch) first: TTFT pays for it.
        self._tasks.spawn(self._lookup(request, enqueue), f"lookup {request.request_id}")
        return True

    async def _lookup(self, request: Request, enqueue: Enqueue) -> None:
        try:
            lookup = await self.reuse.lookup(request)
        except Exception:  # a bug in the lookup must cost the request its reuse, never the request itself
            log.exception("prefix lookup of request %d failed; computing it whole", request.request_id)
            lookup = self.reuse.recompute(request)
        self._lookups[request.request_id] = lookup
        enqueue(request, lookup.cached_tokens)  # withdrawn meanwhile: the prefill does not queue it

    def cached_tokens(self, request_id: int) -> int:
        lookup = self._lookups.get(request_id)
        return lookup.cached_tokens if lookup is not None else 0

    def step_ran(self, request_id: int) -> None:
        """The blocks this step computed go to the cache, in the background."""
        lookup = self._lookups.pop(request_id, None)
        if lookup is not None:
            self.reuse.write_back(request_id, lookup)

    def forget(self, request_id: int) -> None:
        self._lookups.pop(request_id, None)

    def stats(self) -> dict[str, Any]:
        return {"prefix": self.reuse.stats()}

    async def settled(self) -> None:
        # The middlebox's relay counts a write-back's bytes as they cross; this side counts them once the pool
        # has answered. Bounded: a write-back stuck on a dead pool must not hold /stats past the reader's 2 s.
        await self.reuse.write_backs_settled(timeout_s=WRITE_BACK_SETTLE_S)

    async def close(self) -> None:
        await self._tasks.close()
        await self.reuse.close()


class PoolRelayPart(Part):
    """The middlebox's pool port and its relay to the KV pool."""

    name = "pool relay"

    def __init__(self, agent: Any, kvpool: Address, pool_listen: Address):
        self.relay = PoolRelay(agent.middlebox, kvpool.host, kvpool.port, registry=agent.registry)
        self.pool_listen = pool_listen

    async def start(self, ctx: AgentContext) -> None:
        await ctx.listen(self.pool_listen, "--pool-listen", self.relay.handle_prefill, Role.MIDDLEBOX, Role.PREFILL,
                         port_key="pool_port")

    def stats(self) -> dict[str, Any]:
        return {"pool_relay": self.relay.stats()}

    async def close(self) -> None:
        await self.relay.close()
