"""A record of exactly what one run created, written after every creation, so cleanup can remove exactly that.

The manifest is a JSON file listing resources in creation order. Cleanup walks it backwards and deletes each
by its recorded name, skipping what is already gone; it never lists, matches or deletes anything by pattern.
A veth end or qdisc whose `netns` is null lives in the root namespace (topology.ROOT_AGENT).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtransit.shaping import commands
from kvtransit.shaping.errors import CommandFailed, ShapingError
from kvtransit.shaping.runner import Runner, run_command

MANIFEST_VERSION = 1
KINDS = ("netns", "veth", "qdisc")


@dataclass
class Manifest:
    run_id: str
    resources: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None
    # Addresses, link plans: for people and the launcher, not cleanup.
    info: dict[str, Any] = field(default_factory=dict)

    def record(self, kind: str, **names: str | None) -> None:
        """Note one created resource and persist at once (a crash right after still leaves it on file)."""
        if kind not in KINDS:
            raise ValueError(f"unknown resource kind {kind!r}")
        self.resources.append({"kind": kind, **names})
        self.save()

    def to_json(self) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, "run_id": self.run_id, "resources": self.resources, "info": self.info}

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2))
        os.replace(tmp, self.path)  # atomic: a reader never sees half a manifest

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ShapingError("manifest", str(path), "no such file") from None
        except json.JSONDecodeError as exc:
            raise ShapingError("manifest", str(path), f"not JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise ShapingError("manifest", str(path), f"not a kvtransit links manifest version {MANIFEST_VERSION}")
        for item in data.get("resources", []):
            if not isinstance(item, dict) or item.get("kind") not in KINDS:
                raise ShapingError("manifest", str(path), f"bad resource entry {item!r}")
        return cls(run_id=data["run_id"], resources=list(data["resources"]), path=path, info=data.get("info", {}))


def existing_namespaces(runner: Runner) -> set[str]:
    """Names from `ip netns list` ("NAME (id: N)" per line)."""
    return {line.split()[0] for line in runner(commands.netns_list_argv()).splitlines() if line.strip()}


def _existing_links(runner: Runner, namespace: str | None) -> set[str]:
    # `ip -o link show` lines: "2: NAME@if3: <...> ..."; the name ends at '@' or ':'.
    names = set()
    for line in runner(commands.link_list_argv(namespace)).splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.add(parts[1].strip().split("@")[0])
    return names


def cleanup_argv_plan(manifest: Manifest, namespaces: set[str | None],
                      links: dict[str | None, set[str]]) -> list[list[str]]:
    """The delete commands for what still exists, newest first. Pure, so its order can be tested.
    `namespaces` holds None when the root namespace's devices are to be considered."""
    argvs = []
    for item in reversed(manifest.resources):
        kind = item["kind"]
        if kind == "qdisc":
            if item["netns"] in namespaces and item["dev"] in links.get(item["netns"], set()):
                argvs.append(commands.unshape_argv(item["netns"], item["dev"]))
        elif kind == "veth":
            # Deleting one end removes its peer; whichever end survives (namespaces may be half gone) goes.
            for ns, dev in ((item["netns"], item["dev"]), (item["peer_netns"], item["peer"])):
                if ns in namespaces and dev in links.get(ns, set()):
                    argvs.append(commands.link_del_argv(ns, dev))
                    break
        elif kind == "netns" and item["name"] in namespaces:
            argvs.append(commands.netns_del_argv(item["name"]))
    return argvs


def cleanup(manifest: Manifest, runner: Runner = run_command) -> list[list[str]]:
    """Delete everything the manifest lists that still exists (after a crash, some may be gone). Tries every
    item; raises the first failure at the end (with its command and stderr). Returns the commands it ran."""
    ours = {item["name"] for item in manifest.resources if item["kind"] == "netns"}
    namespaces: set[str | None] = set(existing_namespaces(runner) & ours)
    if _touches_root(manifest):
        namespaces.add(None)
    links = {ns: _existing_links(runner, ns) for ns in namespaces}
    return _run_deletes(cleanup_argv_plan(manifest, namespaces, links), runner)


def rollback(manifest: Manifest, runner: Runner = run_command) -> list[list[str]]:
    """Undo a build that failed part-way: everything in the manifest was made moments ago by this process, so
    it is deleted without asking the kernel what exists first."""
    namespaces: set[str | None] = {item["name"] for item in manifest.resources if item["kind"] == "netns"}
    if _touches_root(manifest):
        namespaces.add(None)
    links: dict[str | None, set[str]] = {}
    for item in manifest.resources:
        if item["kind"] == "veth":
            links.setdefault(item["netns"], set()).add(item["dev"])
            links.setdefault(item["peer_netns"], set()).add(item["peer"])
    return _run_deletes(cleanup_argv_plan(manifest, namespaces, links), runner)


def _touches_root(manifest: Manifest) -> bool:
    return any(item["kind"] in ("veth", "qdisc") and None in (item.get("netns", ""), item.get("peer_netns", ""))
               for item in manifest.resources)


# What tc / ip say when the thing is already gone (a veth takes its peer and its root qdisc with it).
_ALREADY_GONE = ("Cannot find device", "No such file", "No such device", "Invalid handle", "Cannot delete qdisc")


def _run_deletes(argvs: list[list[str]], runner: Runner) -> list[list[str]]:
    ran, failures = [], []
    for argv in argvs:
        try:
            runner(argv)
            ran.append(argv)
        except CommandFailed as exc:
            if any(text in exc.stderr for text in _ALREADY_GONE):
                continue
            failures.append(exc)
    if failures:
        raise failures[0]
    return ran  # the manifest file stays: cleaning again is a no-op, and it documents what the run made
