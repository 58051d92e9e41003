"""toxiproxy's HTTP API on the middlebox's control port, so toxiproxy clients and Chaos Toolkit can fault the link.

    GET    /version                              {"version": ...}
    GET    /proxies                              {name: proxy with its toxics}
    GET    /proxies/{proxy}                      one proxy
    POST   /proxies/{proxy}  (or PATCH)          {"enabled": false} takes the link down, true brings it back
    GET    /proxies/{proxy}/toxics               its toxics
    POST   /proxies/{proxy}/toxics               add one: {"name", "type", "stream", "toxicity", "attributes"}
    GET    /proxies/{proxy}/toxics/{toxic}       one toxic
    POST   /proxies/{proxy}/toxics/{toxic}       update it (or PATCH): attributes merge, toxicity replaces
    DELETE /proxies/{proxy}/toxics/{toxic}       remove it
    POST   /reset                                every proxy enabled, every toxic and fault removed

Shapes, status codes and error bodies ({"error": message, "status": code}) follow toxiproxy 2.12's api.go.
There is one proxy, KV_PROXY: the KV link through this middlebox (listen = where prefills connect, upstream =
the decode instances). It cannot be created or deleted (the testbed's topology is the launcher's): POST /proxies
and DELETE /proxies/{proxy} answer 405. What each toxic becomes is toxics.py's business; the faults it makes also
show in the middlebox's own `GET /faults`, named `toxiproxy.<proxy>.<toxic>`, and `/reset` clears those too.
"""

from __future__ import annotations

from typing import Any

from kvtransit import __version__
from kvtransit.agents.middlebox.app import Middlebox
from kvtransit.agents.middlebox.faults.reset_peer import ResetPeer
from kvtransit.agents.middlebox.faults.toxicity import PerConnection
from kvtransit.agents.middlebox.toxics import Toxic, new_toxic, updated_toxic
from kvtransit.model.errors import ConfigError
from kvtransit.runtime.http import HttpError, HttpRequest, HttpResponse, HttpServer

KV_PROXY = "kv"
TOXIPROXY_API_VERSION = "2.12.0"  # the API these routes follow (Shopify/toxiproxy api.go, CHANGELOG 2.12.0)
DISABLED = "disabled"  # the fault that takes a disabled proxy's link down


def _error(status: int, message: str) -> HttpResponse:
    return HttpResponse.json({"error": message, "status": status}, status)


class ToxiproxyFacade:
    """The one proxy's state (enabled, toxics by name, in order) and its effect on the middlebox."""

    def __init__(self, middlebox: Middlebox, *, listen: str):
        self.middlebox = middlebox
        self.listen = listen
        self.enabled = True
        self.toxics: dict[str, Toxic] = {}

    def fault_name(self, toxic_name: str) -> str:
        return f"toxiproxy.{KV_PROXY}.{toxic_name}"

    def proxy_json(self) -> dict[str, Any]:
        upstream = ",".join(f"{peer.host}:{peer.port}" for peer in self.middlebox.decode_peers.peers)
        return {"name": KV_PROXY, "listen": self.listen, "upstream": upstream, "enabled": self.enabled,
                "toxics": [t.as_json() for t in self.toxics.values()]}

    # -- changes --------------------------------------------------------------------------------------------

    def add(self, toxic: Toxic) -> Toxic:
        if toxic.name in self.toxics:
            raise HttpError(409, "toxic already exists")
        self._install(toxic)
        self.toxics[toxic.name] = toxic
        return toxic

    def update(self, name: str, body: Any) -> Toxic:
        toxic = updated_toxic(self.toxics[name], body)
        self._install(toxic)
        self.toxics[name] = toxic
        return toxic

    def remove(self, name: str) -> None:
        toxic = self.toxics.pop(name)
        self.middlebox.faults.delete(self.fault_name(name))
        if toxic.type == "latency":
            self._retune_delay()

    def set_enabled(self, enabled: bool) -> None:
        """A disabled proxy closes its connections (toxiproxy): every write to decode resets the link, so hand-offs
        fail over to their retries until it is enabled again."""
        self.enabled = enabled
        if enabled:
            self.middlebox.faults.delete(self.fault_name(DISABLED))
        else:
            self.middlebox.faults.put(ResetPeer(self.fault_name(DISABLED), {}, clock=self.middlebox.fault_clock))

    def reset(self) -> None:
        self.toxics.clear()
        self.enabled = True
        self.middlebox.faults.clear()
        self._retune_delay()

    def _install(self, toxic: Toxic) -> None:
        """Make `toxic` take effect (replacing a toxic of the same name); ConfigError leaves things as they were."""
        fault = toxic.fault(self.fault_name(toxic.name), self.middlebox.fault_clock)
        if fault is not None:
            self.middlebox.faults.put(fault if toxic.toxicity == 1.0 else PerConnection(fault, toxic.toxicity))
        else:
            self.middlebox.faults.delete(self.fault_name(toxic.name))
        if toxic.type == "latency":
            self._retune_delay(replacing=toxic)

    def _retune_delay(self, replacing: Toxic | None = None) -> None:
        toxics = dict(self.toxics)
        if replacing is not None:
            toxics[replacing.name] = replacing
        delays = [t.delay_s for t in toxics.values() if t.type == "latency"]
        latency_s = sum(latency for latency, _ in delays)
        jitter_s = sum(jitter ** 2 for _, jitter in delays) ** 0.5  # independent jitters add in variance
        self.middlebox.chain.link.set_fault_delay(latency_s, jitter_s)


def register_toxiproxy_routes(http: HttpServer, middlebox: Middlebox, *, listen: str) -> ToxiproxyFacade:
    """toxiproxy's routes on `http` (the control API's server), acting on `middlebox`."""
    facade = ToxiproxyFacade(middlebox, listen=listen)

    async def version(_request: HttpRequest) -> dict:
        return {"version": TOXIPROXY_API_VERSION, "kvtransit": __version__}

    async def proxies(_request: HttpRequest) -> dict:
        return {KV_PROXY: facade.proxy_json()}

    async def no_proxy_changes(request: HttpRequest) -> HttpResponse:
        return _error(405, f"{request.method} {request.path}: the testbed's proxy {KV_PROXY!r} is fixed (its "
                           "topology is the launcher's); toxics and enabled can be changed")

    async def reset(_request: HttpRequest) -> HttpResponse:
        facade.reset()
        return HttpResponse(204, b"")

    async def under_proxies(request: HttpRequest) -> HttpResponse | dict | list:
        parts = request.path[len("/proxies/"):].split("/")
        if parts[0] != KV_PROXY:
            return _error(404, "proxy not found")
        try:
            return _proxy_route(facade, request, parts[1:])
        except HttpError as exc:
            return _error(exc.status, exc.message)
        except (ConfigError, ValueError) as exc:
            return _error(400, str(exc))

    http.route("GET", "/version", version)
    http.route("GET", "/proxies", proxies)
    http.route("POST", "/proxies", no_proxy_changes)
    http.route("POST", "/reset", reset)
    for method in ("GET", "POST", "PATCH", "DELETE"):
        http.route(method, "/proxies/", under_proxies)
    return facade


def _proxy_route(facade: ToxiproxyFacade, request: HttpRequest, rest: list[str]) -> HttpResponse | dict | list:
    method = request.method
    if not rest:  # /proxies/{proxy}
        if method == "GET":
            return facade.proxy_json()
        if method in ("POST", "PATCH"):
            body = request.json()
            if not isinstance(body, dict):
                raise ConfigError(f"a proxy update is a JSON object, got {type(body).__name__}")
            unknown = sorted(set(body) - {"name", "listen", "upstream", "enabled"})
            if unknown:
                raise ConfigError(f"unknown proxy field {unknown[0]!r} (fields: name, listen, upstream, enabled)")
            if "enabled" in body:
                if not isinstance(body["enabled"], bool):
                    raise ConfigError(f"proxy field 'enabled': expected true or false, got {body['enabled']!r}")
                facade.set_enabled(body["enabled"])
            return facade.proxy_json()
        raise HttpError(405, f"{method} {request.path}: the testbed's proxy {KV_PROXY!r} cannot be deleted")
    if rest[0] != "toxics" or len(rest) > 2:
        raise HttpError(404, f"no route {request.path}")
    if len(rest) == 1:  # /proxies/{proxy}/toxics
        if method == "GET":
            return [t.as_json() for t in facade.toxics.values()]
        if method == "POST":
            return facade.add(new_toxic(request.json())).as_json()
        raise HttpError(405, f"{method} not allowed on {request.path} (allowed: GET, POST)")
    name = rest[1]
    if name not in facade.toxics:
        raise HttpError(404, "toxic not found")
    if method == "GET":
        return facade.toxics[name].as_json()
    if method in ("POST", "PATCH"):
        return facade.update(name, request.json()).as_json()
    facade.remove(name)  # DELETE
    return HttpResponse(204, b"")
