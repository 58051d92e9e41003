"""Imports point one way (ARCHITECTURE.md), and the flows are plug-ins (kvtransit/flows/__init__.py).

The core's layers: cli → harness → agents → {report, workload} → runtime → {kernels → model, wire}; shaping alone;
realmodel sits on kernels and model; the twin on model, kernels, report and workload, pure, under the harness and
the CLI. The harness may use the agents; no agent imports the harness, so a process never
depends on what starts or judges it.

The flows: the core imports no flow's module, only the registry (`kvtransit.flows`, which loads a flow's faces by
name); a flow may import the core and itself, and another flow only if it is built on it (FLOWS' `built_on`). A
flow's pure part (its `section.py`, `model*.py`, and every module of the flow they import) follows the pure layers'
rules; its agent side (its `components.py` and the modules of the flow that import, processes it starts) never
imports the harness or the CLI.

Read from the source with `ast`, so a lazy import inside a function counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

from kvtransit.flows import FLOWS

SRC = Path(__file__).resolve().parents[2] / "src" / "kvtransit"
REGISTRY = "flows"  # kvtransit.flows: the registry a core layer may import (never a module under it)

# Which kvtransit core packages each core package may import (itself always allowed).
ALLOWED_INTERNAL = {
    "wire": set(),
    "model": set(),
    "kernels": {"model"},
    "shaping": set(),
    "runtime": {"wire", "model", "kernels", "shaping"},
    "realmodel": {"model", "kernels"},
    "workload": {"model"},
    "report": {"model", "wire", "workload", "realmodel"},
    "twin": {"model", "kernels", "report", "workload"},
    "agents": {"runtime", "wire", "model", "kernels", "shaping", "realmodel", "report", "workload"},
    "harness": {"twin", "agents", "runtime", "wire", "model", "kernels", "shaping", "realmodel", "report", "workload"},
    "cli": {"harness", "twin", "agents", "runtime", "wire", "model", "kernels", "shaping", "realmodel", "report",
            "workload"},
}
CORE = set(ALLOWED_INTERNAL)
# The core layers that reach the flows through the registry (the others know nothing of them).
REACH_REGISTRY = {"model", "runtime", "report", "agents", "harness", "cli"}
# Modules of the package's root anyone may import: its version, where its files are.
ROOT_MODULES = {"paths"}
# Third-party packages each layer may import; stdlib is always allowed except where banned below.
ALLOWED_THIRD_PARTY = {
    "wire": {"crc32c"},  # CRC32C in C: a pure-Python CRC of a 256 MB payload would dominate
    "model": set(),
    "kernels": {"numpy", "scipy", "pyfftw", "ml_dtypes"},
    "shaping": set(),
    "runtime": None,  # any declared dependency
    # The realkv extra's torch and transformers, imported only inside realmodel (never on the default install's
    # paths: tests/unit/test_realmodel_offline.py checks `import kvtransit.cli` loads neither).
    "realmodel": {"numpy", "ml_dtypes", "torch", "transformers"},
    "workload": set(),
    "twin": {"numpy", "ml_dtypes"},  # the kernels' encoders size the wire (twin/link.py)
    "report": None,  # its figures draw with matplotlib (the plots extra)
    "agents": None,
    "harness": None,
    "cli": None,
}
# The pure layers hold no sockets, event loops, clocks, threads, loggers or metrics.
BANNED_IN_PURE = {"asyncio", "socket", "selectors", "uvloop", "prometheus_client", "time", "threading",
                  "subprocess", "logging", "multiprocessing"}
PURE = {"wire", "model", "kernels", "twin"}  # the twin: the model on its own clock, no I/O
# What a flow's pure part may import of the core: the pure layers.
PURE_FOR_FLOWS = {"model", "kernels", "wire"}
# What a flow's agent side may not import.
ABOVE_AGENTS = {"harness", "cli"}


@functools.cache  # every rule reads the same files: parse each once a session
def _imports(path: Path, root: Path = SRC.parent) -> tuple[tuple[int, str], ...]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package_parts = path.relative_to(root).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = package_parts[: len(package_parts) - node.level + 1]
                name = ".".join(base + ((node.module,) if node.module else ()))
            else:
                name = node.module or ""
            # `from kvtransit import flows` names the registry module, as `import kvtransit.flows` does
            found += [(node.lineno, f"{name}.{alias.name}") if name in ("kvtransit", "kvtransit.flows") else
                      (node.lineno, name) for alias in node.names]
    return tuple(found)


def _core_files():
    for layer in ALLOWED_INTERNAL:
        for path in sorted((SRC / layer).rglob("*.py")):
            yield layer, path


def _flow_files():
    for flow in FLOWS:
        for path in sorted((SRC / "flows" / flow).rglob("*.py")):
            yield flow, path


def test_every_layer_package_and_every_registered_flow_exists():
    assert {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} >= CORE | {REGISTRY}
    assert {p.name for p in (SRC / "flows").iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(FLOWS)


def _core_problems(layer: str, path: Path, root: Path = SRC.parent) -> list[str]:
    stdlib = sys.stdlib_module_names
    problems = []
    for lineno, name in _imports(path, root):
        top = name.split(".")[0]
        where = f"{path.relative_to(root)}:{lineno}"
        if top == "kvtransit":
            parts = name.split(".")
            if len(parts) == 1 or parts[1] in ROOT_MODULES:
                continue
            target = parts[1]
            if target == REGISTRY:
                if len(parts) > 2 and parts[2] not in ("FLOWS", "FlowEntry", "face", "faces", "attribute"):
                    problems.append(f"{where}: {layer} must not import a flow's module ({name}): reach it through "
                                    "the registry")
                elif layer not in REACH_REGISTRY:
                    problems.append(f"{where}: {layer} must not reach the flows")
            elif target != layer and target not in ALLOWED_INTERNAL[layer] and target in ALLOWED_INTERNAL:
                problems.append(f"{where}: {layer} must not import kvtransit.{target}")
        elif layer in PURE and top in BANNED_IN_PURE:
            problems.append(f"{where}: pure layer {layer} must not import {top}")
        elif top not in stdlib and ALLOWED_THIRD_PARTY[layer] is not None and top not in ALLOWED_THIRD_PARTY[layer]:
            problems.append(f"{where}: {layer} must not import third-party {top}")
    return problems


@pytest.mark.parametrize("layer,path", list(_core_files()), ids=lambda v: str(v).split("src/")[-1])
def test_the_core_imports_point_one_way_and_reach_no_flow_but_through_the_registry(layer, path):
    problems = _core_problems(layer, path)
    assert not problems, "\n".join(problems)


def _flow_module(name: str) -> tuple[str, str] | None:
    """(flow, module path under it) of a `kvtransit.flows.<flow>...` import, else None."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[:2] == ["kvtransit", "flows"] and parts[2] in FLOWS:
        return parts[2], "/".join(parts[3:])
    return None


def _module_path(flow: str, module: str) -> Path | None:
    base = SRC / "flows" / flow
    for candidate in (base / f"{module}.py", base / module / "__init__.py") if module else (base / "__init__.py",):
        if candidate.exists():
            return candidate
    # `from kvtransit.flows.tp.rank import rank` names a module under a package: its parent is what was imported
    parent = module.rpartition("/")[0]
    return _module_path(flow, parent) if parent else None


def _closure(flow: str, roots: list[Path]) -> set[Path]:
    """`roots` and every module of flow `flow` (or one it is built on) they import, transitively."""
    allowed = {flow, *FLOWS[flow].built_on}
    seen: set[Path] = set()
    todo = [r for r in roots if r.exists()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for _, name in _imports(path):
            target = _flow_module(name)
            if target is not None and target[0] in allowed:
                module = _module_path(*target)
                if module is not None:
                    todo.append(module)
    return seen


def _flow_problems(flow: str, path: Path, *, pure: bool, agent_side: bool, root: Path = SRC.parent) -> list[str]:
    problems = []
    allowed_flows = {flow, *FLOWS[flow].built_on}
    for lineno, name in _imports(path, root):
        top = name.split(".")[0]
        where = f"{path.relative_to(root)}:{lineno}"
        if top == "kvtransit":
            parts = name.split(".")
            if len(parts) == 1 or parts[1] in ROOT_MODULES:
                continue
            target = _flow_module(name)
            if target is not None and target[0] not in allowed_flows:
                problems.append(f"{where}: flow {flow} must not import flow {target[0]} (not among those it is built "
                                f"on: {', '.join(FLOWS[flow].built_on) or 'none'})")
            elif parts[1] in CORE and pure and parts[1] not in PURE_FOR_FLOWS:
                problems.append(f"{where}: flow {flow}'s pure part must not import kvtransit.{parts[1]}")
            elif parts[1] in ABOVE_AGENTS and agent_side:
                problems.append(f"{where}: flow {flow}'s agent side must not import kvtransit.{parts[1]}")
        elif pure and top in BANNED_IN_PURE:
            problems.append(f"{where}: flow {flow}'s pure part must not import {top}")
    return problems


def _flow_parts(flow: str) -> tuple[set[Path], set[Path]]:
    base = SRC / "flows" / flow
    pure = _closure(flow, [base / "section.py", *base.glob("model*.py")])
    agent_roots = [base / "components.py", *base.rglob("__main__.py"), *base.rglob("follower.py")]
    agent = _closure(flow, agent_roots)
    return pure, agent


@pytest.mark.parametrize("flow,path", list(_flow_files()), ids=lambda v: str(v).split("src/")[-1])
def test_a_flow_imports_the_core_itself_and_what_it_is_built_on_and_its_pure_part_stays_pure(flow, path):
    pure, agent = _flow_parts(flow)
    problems = _flow_problems(flow, path, pure=path in pure and path.name != "__init__.py", agent_side=path in agent)
    assert not problems, "\n".join(problems)


def test_a_flows_pure_part_and_agent_side_are_what_they_should_hold():
    """The closures the rules above apply to are not empty: the ring's section pulls in its class rule, the tier's
    components their prefix cache."""
    ring_pure, _ = _flow_parts("ring")
    assert SRC / "flows" / "ring" / "ring_class.py" in ring_pure
    _, tier_agent = _flow_parts("tier")
    assert SRC / "flows" / "tier" / "prefix_cache.py" in tier_agent


# A flow's fields are its own: named in the code of its folder (and of the flows built on it) only, never in the
# core's. Checked on the code's names and string literals (comments and docstrings may speak of them); the generic
# words some fields are (`select`, `page_size`, kernel parameters too) are left out.
GENERIC_FIELD_NAMES = {"select", "page_size"}


def _code_words(path: Path) -> set[str]:
    words: set[str] = set()
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME:
            words.add(tok.string)
        elif tok.type == tokenize.STRING:
            before = next((t for t in reversed(tokens[:i]) if t.type not in (tokenize.NL, tokenize.NEWLINE,
                                                                             tokenize.INDENT, tokenize.DEDENT,
                                                                             tokenize.COMMENT)), None)
            docstring = before is None or before.string in (":", "") or before.type == tokenize.DEDENT
            if not docstring and not tok.string.lstrip("rbfuRBFU").startswith(('"""', "'''")):
                words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", tok.string))
    return words


def test_a_flows_fields_are_named_only_in_its_own_folder_and_its_dependants():
    from kvtransit.model.scenario import section_classes

    owners = {name: kind.FLOW for kind in section_classes() for name in kind.field_names()
              if name not in GENERIC_FIELD_NAMES}
    dependants = {flow: {flow, *(f for f, entry in FLOWS.items() if flow in entry.built_on)} for flow in FLOWS}
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        in_flow = rel.parts[0] == "flows" and len(rel.parts) > 2 and rel.parts[1] in FLOWS
        for word in _code_words(path) & set(owners):
            if not (in_flow and rel.parts[1] in dependants[owners[word]]):
                problems.append(f"{rel}: names {owners[word]}'s field {word}")
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_violation(tmp_path):
    """The rule itself can fail: a planted bad import is found (planted in a temporary folder, never the package)."""
    planted = tmp_path / "kvtransit" / "model" / "_planted_violation.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("import asyncio\nfrom kvtransit.runtime import x\nfrom ..harness import launcher\n"
                       "from kvtransit.flows.ring import section\nfrom kvtransit import flows\n")
    assert _core_problems("model", planted, root=tmp_path) == [
        "kvtransit/model/_planted_violation.py:1: pure layer model must not import asyncio",
        "kvtransit/model/_planted_violation.py:2: model must not import kvtransit.runtime",
        "kvtransit/model/_planted_violation.py:3: model must not import kvtransit.harness",
        ("kvtransit/model/_planted_violation.py:4: model must not import a flow's module (kvtransit.flows.ring): "
        "reach it through the registry"),
    ]


def test_an_agent_importing_the_harness_is_refused(tmp_path):
    planted = tmp_path / "kvtransit" / "agents" / "middlebox" / "_planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from ...harness.up.placement import SHAPED_MTU\n")
    assert _core_problems("agents", planted, root=tmp_path) == [
        "kvtransit/agents/middlebox/_planted.py:1: agents must not import kvtransit.harness"]


def test_a_flow_importing_another_it_is_not_built_on_or_its_pure_part_reaching_runtime_is_refused(tmp_path):
    planted = tmp_path / "kvtransit" / "flows" / "ring" / "_planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from kvtransit.flows.tier import section\nimport kvtransit.runtime.clock\nimport asyncio\n"
                       "from kvtransit.harness.up import launcher\n")
    assert _flow_problems("ring", planted, pure=True, agent_side=True, root=tmp_path) == [
        ("kvtransit/flows/ring/_planted.py:1: flow ring must not import flow tier (not among those it is built on: "
        "none)"),
        "kvtransit/flows/ring/_planted.py:2: flow ring's pure part must not import kvtransit.runtime",
        "kvtransit/flows/ring/_planted.py:3: flow ring's pure part must not import asyncio",
        "kvtransit/flows/ring/_planted.py:4: flow ring's pure part must not import kvtransit.harness",
    ]
    built_on = tmp_path / "kvtransit" / "flows" / "selection" / "_planted.py"
    built_on.parent.mkdir(parents=True)
    built_on.write_text("from kvtransit.flows.tier.section import TierSection\n")
    assert _flow_problems("selection", built_on, pure=False, agent_side=False, root=tmp_path) == []
