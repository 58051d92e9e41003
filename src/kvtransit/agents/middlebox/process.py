"""The middlebox as a process: listen for prefills, connect to decodes, serve /metrics and the control API."""

from __future__ import annotations

import asyncio

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.control import register_control_routes
from kvtransit.agents.middlebox.toxiproxy_api import register_toxiproxy_routes
from kvtransit.agents.process import Address, announce_ready, listen, new_registry, port_in_use_error, start_http
from kvtransit.flows.selection.middlebox_relay import RemoteKvRelay
from kvtransit.flows.tier.middlebox_pool import PoolRelay
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.http import HttpServer
from kvtransit.runtime.metrics import remote_kv_metrics
from kvtransit.wire.events import Role


class MiddleboxProcess:
    def __init__(self, scenario: Scenario, *, name: str, listen: Address, decodes: list[Address],
                 metrics_listen: Address, control_listen: Address, control_token: str | None = None,
                 link_backend: str = "userspace", kvpool: Address | None = None,
                 pool_listen: Address | None = None, decode_remote_kv: list[Address] | None = None,
                 kvpool_remote_kv: Address | None = None):
        """`kvpool`: the KV pool behind us; prefills then reach it through `pool_listen` (pool.py).
        `decode_remote_kv`, `kvpool_remote_kv` (`--kv-placement remote`): decode's and the pool's remote-KV ports,
        between which we relay each decode step's legs (remote_kv.py)."""
        self.registry, _shared = new_registry("middlebox")
        self.middlebox = Middlebox(scenario, [(a.host, a.port) for a in decodes], registry=self.registry,
                                   name=name, link_backend=link_backend)
        self.pool_relay = (PoolRelay(self.middlebox, kvpool.host, kvpool.port, registry=self.registry)
                           if kvpool is not None else None)
        if scenario.remote_kv and (not decode_remote_kv or kvpool_remote_kv is None):
            raise ConfigError("--kv-placement remote: the middlebox needs --decode-remote-kv and --kvpool-remote-kv "
                              "(decode's and the pool's remote-KV ports); `kvtransit up` wires them, the compose "
                              "testbed does not")
        self.remote_kv = (RemoteKvRelay(self.middlebox, [(a.host, a.port) for a in decode_remote_kv or []],
                                        (kvpool_remote_kv.host, kvpool_remote_kv.port),
                                        remote_kv_metrics(self.registry))
                          if scenario.remote_kv and kvpool_remote_kv is not None else None)
        self.pool_listen = pool_listen or Address("127.0.0.1", 0)
        self.listen_address = listen
        self.metrics_listen = metrics_listen
        self.control_listen = control_listen
        self.control_token = control_token

    async def run(self, stop: asyncio.Event) -> None:
        mb = self.middlebox
        await mb.connect_decodes()
        server = await listen(self.listen_address, "--listen", mb.handle_prefill, Role.MIDDLEBOX, Role.PREFILL)
        relay = self.pool_relay
        pool_server = (await listen(self.pool_listen, "--pool-listen", relay.handle_prefill, Role.MIDDLEBOX,
                                    Role.PREFILL) if relay is not None else None)
        remote = self.remote_kv
        if remote is not None:
            remote.start()

        def stats() -> dict:
            return {**mb.stats(), **({"pool_relay": relay.stats()} if relay is not None else {}),
                    **({"remote_kv": remote.stats.to_json(mb.model_bytes_per_byte)} if remote is not None else {})}

        http = await start_http(self.metrics_listen, self.registry, stats)
        control = HttpServer(token=self.control_token)
        register_control_routes(control, mb)
        register_toxiproxy_routes(control, mb, listen=f"{self.listen_address.host}:{server.port}")
        try:
            await control.start(self.control_listen.host, self.control_listen.port)
        except OSError as exc:
            raise port_in_use_error(self.control_listen, "--control-listen", exc) from None
        announce_ready("middlebox", mb.name, listen_port=server.port, metrics_port=http.port,
                       control_port=control.port, link_backend=mb.link_backend,
                       **({"pool_port": pool_server.port} if pool_server is not None else {}))
        try:
            await stop.wait()
        finally:
            await server.shutdown(2.0)
            if pool_server is not None:
                await pool_server.shutdown(1.0)
            if relay is not None:
                await relay.close()
            if remote is not None:
                await remote.close()
            await mb.close()
            await control.close()
            await http.close()
