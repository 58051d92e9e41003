"""The middlebox as a process: listen for prefills, connect to decodes, serve /metrics and the control API, on the
skeleton's lifecycle (agents/skeleton.py); the flows plug in parts of their own (the tier's pool port, selection's
remote-KV relay)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.control import register_control_routes
from kvtransit.agents.middlebox.toxiproxy_api import register_toxiproxy_routes
from kvtransit.agents.plugins import flow_parts
from kvtransit.agents.process import Address, new_registry
from kvtransit.agents.skeleton import AgentContext, Part
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.http import HttpServer
from kvtransit.wire.events import Role


class MiddleboxProcess:
    role = "middlebox"

    def __init__(self, scenario: Scenario, *, name: str, listen: Address, decodes: list[Address],
                 metrics_listen: Address, control_listen: Address, control_token: str | None = None,
                 link_backend: str = "userspace", flow_args: Mapping[str, Any] | None = None):
        """`flow_args`: the flows' flags for this process by name (agents/plugins.py: the KV pool behind us and the
        port prefills reach it on; decode's and the pool's remote-KV ports)."""
        self.scenario = scenario
        self.registry, _shared = new_registry("middlebox")
        self.middlebox = Middlebox(scenario, [(a.host, a.port) for a in decodes], registry=self.registry,
                                   name=name, link_backend=link_backend)
        self.name = self.middlebox.name
        self.listen_address = listen
        self.metrics_listen = metrics_listen
        self.control_listen = control_listen
        self.control_token = control_token
        self.parts: list[Part] = flow_parts("middlebox", self, flow_args or {})

    def stats(self) -> dict:
        return self.middlebox.stats()

    async def start(self, ctx: AgentContext) -> None:
        mb = self.middlebox
        await mb.connect_decodes()
        ctx.on_close(mb.close)
        server = await ctx.listen(self.listen_address, "--listen", mb.handle_prefill, Role.MIDDLEBOX, Role.PREFILL,
                                  port_key="listen_port", grace_s=2.0)
        control = HttpServer(token=self.control_token)
        register_control_routes(control, mb)
        register_toxiproxy_routes(control, mb, listen=f"{self.listen_address.host}:{server.port}")
        await ctx.serve_http(control, self.control_listen, "--control-listen", port_key="control_port")
        ctx.announce(link_backend=mb.link_backend)

    def main_loops(self) -> dict:
        return {}

    async def stopping(self) -> None:
        pass
