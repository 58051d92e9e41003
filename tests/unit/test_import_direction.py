"""Imports point one way (ARCHITECTURE.md): cli → emulator → agents → runtime → {kernels → model, wire}; shaping alone.
`realmodel` (the real model in the loop, issue 16: torch and transformers, the `realkv` extra) sits on kernels and
model, beside runtime; agents, emulator and cli may use it.

The harness (`emulator`: launcher, placement, supervisor, chaos, sweeps) may use the agents; no agent imports the
harness, so a process never depends on what starts or judges it.

Read from the source with `ast`, so a lazy import inside a function counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "kvtransit"

# Which kvtransit packages each package may import (itself always allowed).
ALLOWED_INTERNAL = {
    "wire": set(),
    "model": set(),
    "kernels": {"model"},
    "shaping": set(),
    "runtime": {"wire", "model", "kernels", "shaping"},
    "realmodel": {"model", "kernels"},
    "report": {"model", "wire"},
    "agents": {"runtime", "wire", "model", "kernels", "shaping", "realmodel", "report", "flows"},
    "flows": {"agents", "harness", "runtime", "wire", "model", "kernels", "shaping", "realmodel", "report", "cli"},
    "harness": {"agents", "flows", "runtime", "wire", "model", "kernels", "shaping", "realmodel", "report"},
    "cli": {"harness", "flows", "agents", "runtime", "wire", "model", "kernels", "shaping", "realmodel", "report"},
}
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
    "report": None,
    "agents": None,
    "flows": None,
    "harness": None,
    "cli": None,
}
# The pure layers hold no sockets, event loops, clocks, threads, loggers or metrics.
BANNED_IN_PURE = {"asyncio", "socket", "selectors", "uvloop", "prometheus_client", "time", "threading",
                  "subprocess", "logging", "multiprocessing"}
PURE = {"wire", "model", "kernels"}


def _imports(path: Path, root: Path = SRC.parent) -> list[tuple[int, str]]:
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
            found.append((node.lineno, name))
    return found


def _layer_files():
    for layer in ALLOWED_INTERNAL:
        for path in sorted((SRC / layer).rglob("*.py")):
            yield layer, path


def test_every_layer_package_exists():
    assert {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()} >= set(ALLOWED_INTERNAL)


def _problems(layer: str, path: Path, root: Path = SRC.parent) -> list[str]:
    stdlib = sys.stdlib_module_names
    problems = []
    for lineno, name in _imports(path, root):
        top = name.split(".")[0]
        where = f"{path.relative_to(root)}:{lineno}"
        if top == "kvtransit":
            parts = name.split(".")
            if len(parts) == 1:
                continue  # `import kvtransit` for __version__
            target = parts[1]
            if target != layer and target not in ALLOWED_INTERNAL[layer] and target in ALLOWED_INTERNAL:
                problems.append(f"{where}: {layer} must not import kvtransit.{target}")
        elif layer in PURE and top in BANNED_IN_PURE:
            problems.append(f"{where}: pure layer {layer} must not import {top}")
        elif top not in stdlib and ALLOWED_THIRD_PARTY[layer] is not None and top not in ALLOWED_THIRD_PARTY[layer]:
            problems.append(f"{where}: {layer} must not import third-party {top}")
    return problems


@pytest.mark.parametrize("layer,path", list(_layer_files()), ids=lambda v: str(v).split("src/")[-1])
def test_imports_point_one_way(layer, path):
    problems = _problems(layer, path)
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_violation(tmp_path):
    """The rule itself can fail: a planted bad import is found (planted in a temporary folder, never the package)."""
    planted = tmp_path / "kvtransit" / "model" / "_planted_violation.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("import asyncio\nfrom kvtransit.runtime import x\nfrom ..harness import launcher\n")
    names = [n for _, n in _imports(planted, root=tmp_path)]
    assert names == ["asyncio", "kvtransit.runtime", "kvtransit.harness"]
    assert _problems("model", planted, root=tmp_path) == [
        "kvtransit/model/_planted_violation.py:1: pure layer model must not import asyncio",
        "kvtransit/model/_planted_violation.py:2: model must not import kvtransit.runtime",
        "kvtransit/model/_planted_violation.py:3: model must not import kvtransit.harness",
    ]


def test_an_agent_importing_the_harness_is_refused(tmp_path):
    planted = tmp_path / "kvtransit" / "agents" / "middlebox" / "_planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from ...emulator.placement import SHAPED_MTU\n")
    assert _problems("agents", planted, root=tmp_path) == [
        "kvtransit/agents/middlebox/_planted.py:1: agents must not import kvtransit.harness"]
