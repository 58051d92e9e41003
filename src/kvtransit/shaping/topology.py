"""The testbed in network namespaces: one namespace per agent, a veth pair per link, tc on the shaped ends.

`build_testbed` is what the launcher (`kvtransit up`) calls:

    bed = build_testbed(["prefill", "middlebox", "decode"],
                        [LinkPlan("prefill", "middlebox", module_line_rate_spec),
                         LinkPlan("middlebox", "decode", eth_25g_spec.scaled(s))],
                        manifest_path=run_dir / "links.json")
    try:
        bed.address("decode", "middlebox")            # where the middlebox connects to reach decode
        bed.exec_argv("decode", [sys.executable, "-m", ...])   # run an agent inside its namespace
        bed.link("middlebox", "decode").plan.needs_userspace_delay  # → the middlebox's egress DelayLine
    finally:
        bed.cleanup()

The agent named "host" (ROOT_AGENT) is the root namespace itself: no namespace is made for it, its veth ends
stay in the root namespace (still recorded in the manifest and deleted by exact name), and its links take a
/24 that no route of the root namespace overlaps (checked before anything is made). That is how processes in
the root namespace (the launcher, Prometheus) reach agents inside namespaces without forwarding or NAT.

Every name starts with the run id `kvt<6hex>-`, so parallel runs never clash; a namespace that already exists
is an error before anything is created. Every creation is recorded in the manifest before the next one, and a
failure part-way rolls back what was made and re-raises the failing command with its stderr.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtransit.shaping import commands
from kvtransit.shaping.backend import RUN_ID_PREFIX, Capabilities, Plan, new_run_id, plan, probe
from kvtransit.shaping.errors import CommandFailed, ShapingError
from kvtransit.shaping.manifest import Manifest, cleanup, existing_namespaces, rollback
from kvtransit.shaping.runner import Runner, run_command
from kvtransit.shaping.spec import LinkSpec

# Private test addresses (RFC 1918 10/8). A link between two namespaces is 10.SUBNET_OCTET.i.0/24 (i = its
# index; only ever configured inside this run's own namespaces), the first agent .1 and the second .2.
SUBNET_OCTET = 77
# A link with an end in the root namespace is 10.ROOT_SUBNET_OCTET.x.0/24, x the first /24 (from an offset
# drawn from the run id, so parallel runs rarely even try the same one) that no root route overlaps.
ROOT_SUBNET_OCTET = 78
# The agent that is the root namespace (no namespace is created for it).
ROOT_AGENT = "host"
MAX_LINKS = 254
AGENT_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")  # becomes part of a namespace name
IFNAMSIZ = 15  # Linux interface names: 15 visible characters


@dataclass(frozen=True)
class LinkPlan:
    """A point-to-point link from agent `a` to agent `b`; `spec` shapes a's egress ("to"), b's ("from") or both."""

    a: str
    b: str
    spec: LinkSpec | None = None


@dataclass(frozen=True)
class BuiltLink:
    a: str
    b: str
    dev_a: str
    dev_b: str
    address_a: str
    address_b: str
    spec: LinkSpec | None
    plan: Plan | None

    def describe(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "dev_a": self.dev_a, "dev_b": self.dev_b, "address_a": self.address_a,
                "address_b": self.address_b, "spec": self.spec.describe() if self.spec else None,
                "backends": self.plan.describe() if self.plan else None}

    def shaped_ends(self) -> list[str]:
        """Which agents' egress carries the shaping: a for "to", b for "from", both for "both"."""
        if self.spec is None:
            return []
        return {"to": [self.a], "from": [self.b], "both": [self.a, self.b]}[self.spec.direction]


class Testbed:
    """A built topology: names, addresses, live changes, and cleanup of exactly what was made."""

    def __init__(self, run_id: str, namespaces: dict[str, str | None], links: list[BuiltLink], manifest: Manifest,
                 runner: Runner) -> None:
        self.run_id = run_id
        self.namespaces = namespaces  # agent -> namespace name (None: the root namespace, ROOT_AGENT)
        self.links = links
        self.manifest = manifest
        self._runner = runner

    def namespace(self, agent: str) -> str | None:
        try:
            return self.namespaces[agent]
        except KeyError:
            raise ShapingError("agent", agent, f"not in this testbed; agents: {', '.join(self.namespaces)}") from None

    def link(self, a: str, b: str) -> BuiltLink:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        raise ShapingError("link", f"{a}-{b}", "no such link in this testbed")

    def address(self, agent: str, peer: str) -> str:
        """`agent`'s IPv4 address on its link to `peer` (what `peer` connects to)."""
        link = self.link(agent, peer)
        return link.address_a if link.a == agent else link.address_b

    def exec_argv(self, agent: str, argv: Sequence[str]) -> list[str]:
        return commands.exec_argv(self.namespace(agent), list(argv))

    def _dev(self, link: BuiltLink, agent: str) -> str:
        return link.dev_a if agent == link.a else link.dev_b

    def change(self, a: str, b: str, spec: LinkSpec) -> None:
        """Retune a shaped link in place (`tc ... change`): same back-ends, new numbers."""
        link = self.link(a, b)
        if link.spec is None or link.plan is None:
            raise ShapingError("link", f"{a}-{b}", "was built unshaped; only shaped links can be changed")
        new_plan = plan(spec, _caps_for(link.plan))
        if new_plan != link.plan:
            raise ShapingError("spec", spec.describe(), f"needs back-ends {new_plan.describe()} but the link was "
                               f"built with {link.plan.describe()}; rebuild it instead")
        for agent in link.shaped_ends():
            ns, dev = self.namespace(agent), self._dev(link, agent)
            for argv in commands.shape_argv(ns, dev, spec, link.plan.rate_qdisc, link.plan.use_netem, verb="change"):
                self._runner(argv)
        self.links[self.links.index(link)] = BuiltLink(**{**link.__dict__, "spec": spec})

    def set_state(self, a: str, b: str, state: str) -> None:
        """Take a link down or bring it up (both ends), for chaos."""
        link = self.link(a, b)
        for agent in (link.a, link.b):
            self._runner(commands.link_set_argv(self.namespace(agent), self._dev(link, agent), state))

    def down(self, a: str, b: str) -> None:
        self.set_state(a, b, "down")

    def up(self, a: str, b: str) -> None:
        self.set_state(a, b, "up")

    def describe(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "namespaces": dict(self.namespaces),
                "links": [link.describe() for link in self.links]}

    def cleanup(self) -> list[list[str]]:
        return cleanup(self.manifest, self._runner)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _caps_for(p: Plan) -> Capabilities:
    """The capabilities a plan was made under (so `change` re-plans identically)."""
    qdiscs = {"tbf": p.rate == "tbf", "htb": p.rate == "htb", "netem": p.use_netem}
    return Capabilities(root=True, tc=True, qdiscs=qdiscs)


def _validate(agents: Sequence[str], links: Sequence[LinkPlan], run_id: str) -> None:
    if len(set(agents)) != len(agents):
        raise ShapingError("agents", list(agents), "names must be unique")
    for agent in agents:
        if not isinstance(agent, str) or not AGENT_NAME.match(agent):
            raise ShapingError("agent", agent, "must be lowercase letters and digits, starting with a letter, <= 16")
    if len(links) > MAX_LINKS:
        raise ShapingError("links", len(links), f"at most {MAX_LINKS} links")
    if len(agents) == 1 and ROOT_AGENT in agents:
        raise ShapingError("agents", list(agents), f"{ROOT_AGENT!r} alone makes no namespace to build")
    seen = set()
    for link in links:
        for end in (link.a, link.b):
            if end not in agents:
                raise ShapingError("link", f"{link.a}-{link.b}", f"agent {end!r} is not in agents {list(agents)}")
        if link.a == link.b or frozenset((link.a, link.b)) in seen:
            raise ShapingError("link", f"{link.a}-{link.b}", "links join two different agents, at most once")
        seen.add(frozenset((link.a, link.b)))
    if not re.match(r"^[a-z0-9]{1,9}-$", run_id):
        raise ShapingError("run_id", run_id, "must be 1-9 lowercase letters/digits and a trailing '-'")


def _root_subnets(links: Sequence[LinkPlan], run_id: str, runner: Runner) -> dict[int, str]:
    """link index -> the "10.78.x" prefix of each link with an end in the root namespace: /24s that no route
    of the root namespace overlaps (a clash would shadow the host's own traffic, so it is refused)."""
    wanted = [i for i, link in enumerate(links) if ROOT_AGENT in (link.a, link.b)]
    if not wanted:
        return {}
    routes = []
    for line in runner(commands.route_list_argv(None)).splitlines():
        words = line.split()
        if words and words[0] != "default":
            try:
                routes.append(ipaddress.ip_network(words[0], strict=False))
            except ValueError:
                continue
    start = int(run_id[len(RUN_ID_PREFIX):-1], 16) % 256 if run_id.startswith(RUN_ID_PREFIX) else 0
    chosen: dict[int, str] = {}
    for step in range(256):
        if len(chosen) == len(wanted):
            break
        prefix = f"10.{ROOT_SUBNET_OCTET}.{(start + step) % 256}"
        if not any(ipaddress.ip_network(f"{prefix}.0/24").overlaps(route) for route in routes):
            chosen[wanted[len(chosen)]] = prefix
    if len(chosen) < len(wanted):
        raise ShapingError("root namespace", f"10.{ROOT_SUBNET_OCTET}.0.0/16",
                           f"has no free /24 for {len(wanted)} link(s): "
                           f"routes {', '.join(map(str, routes))} overlap it")
    return chosen


def build_testbed(
    agents: Sequence[str],
    links: Sequence[LinkPlan],
    *,
    runner: Runner = run_command,
    capabilities: Capabilities | None = None,
    manifest_path: str | Path | None = None,
    run_id: str | None = None,
) -> Testbed:
    """Create the namespaces, veths, addresses and tc shaping; return the handle. Raises ShapingError before
    creating anything for bad specs, unrealisable properties or a clashing name; on a failing command part-way,
    deletes what it made and re-raises the failure (command + stderr)."""
    run_id = run_id or new_run_id()
    _validate(agents, links, run_id)
    caps = capabilities if capabilities is not None else probe(runner)
    if not caps.kernel_shaping:
        raise ShapingError("capabilities", caps.describe(), "namespaces with tc shaping need root, tc and tbf or "
                           "htb; use the user-space shaper (shared loopback) instead")
    plans = [plan(link.spec, caps) if link.spec is not None else None for link in links]  # may raise: nothing made
    namespaces = {agent: (None if agent == ROOT_AGENT else f"{run_id}{agent}") for agent in agents}
    made = [ns for ns in namespaces.values() if ns is not None]
    clashes = sorted(set(made) & existing_namespaces(runner))
    if clashes:
        raise ShapingError("namespace", clashes[0], "already exists; refusing to touch what this run did not make")
    root_subnets = _root_subnets(links, run_id, runner)

    manifest = Manifest(run_id=run_id, path=Path(manifest_path) if manifest_path else None)
    built: list[BuiltLink] = []
    try:
        for new_ns in made:
            runner(commands.netns_add_argv(new_ns))
            manifest.record("netns", name=new_ns)
            runner(commands.link_set_argv(new_ns, "lo", "up"))
            for key, value in commands.NAMESPACE_SYSCTLS:
                runner(commands.sysctl_argv(new_ns, key, value))
        for index, (link, link_plan) in enumerate(zip(links, plans, strict=True)):
            mtu = link.spec.mtu if link.spec else 1500
            dev_a, dev_b = f"{run_id}{index}a", f"{run_id}{index}b"
            assert len(dev_a) <= IFNAMSIZ
            ns_a, ns_b = namespaces[link.a], namespaces[link.b]
            runner(commands.veth_add_argv(ns_a, dev_a, ns_b, dev_b, mtu))
            manifest.record("veth", netns=ns_a, dev=dev_a, peer_netns=ns_b, peer=dev_b)
            prefix = root_subnets.get(index, f"10.{SUBNET_OCTET}.{index}")
            addr_a, addr_b = f"{prefix}.1", f"{prefix}.2"
            for ns, dev, addr in ((ns_a, dev_a, addr_a), (ns_b, dev_b, addr_b)):
                runner(commands.addr_add_argv(ns, dev, f"{addr}/24"))
                runner(commands.link_set_argv(ns, dev, "up"))
            result = BuiltLink(link.a, link.b, dev_a, dev_b, addr_a, addr_b, link.spec, link_plan)
            spec, shaping = link.spec, link_plan
            if spec is not None and shaping is not None:  # an unshaped link (no spec, no plan) has no shaped ends
                for agent in result.shaped_ends():
                    ns, dev = namespaces[agent], (dev_a if agent == link.a else dev_b)
                    argvs = commands.shape_argv(ns, dev, spec, shaping.rate_qdisc, shaping.use_netem)
                    if argvs:
                        runner(argvs[0])
                        manifest.record("qdisc", netns=ns, dev=dev)
                        for argv in argvs[1:]:
                            runner(argv)
            built.append(result)
    except BaseException as exc:
        try:
            rollback(manifest, runner)
        except CommandFailed as rollback_error:
            raise rollback_error from exc
        raise
    bed = Testbed(run_id, namespaces, built, manifest, runner)
    manifest.info = bed.describe()
    manifest.save()
    return bed
