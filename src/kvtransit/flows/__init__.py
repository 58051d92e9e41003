"""The flows beside the KV hand-off, each a plug-in in a folder of its own, registered here by name.

The core testbed (prefill, the middlebox, decode, the load generator, the report, `kvtransit up`) carries the KV
hand-off. Every other flow an inference fleet moves is a package `kvtransit.flows.<name>` whose faces are modules
found by name, each optional, loaded only when asked for (as uvicorn chooses its implementations by a string key,
and toxiproxy registers its toxics by name):

- `section.py`: `SECTION`, its Scenario fields, checks, derived figures and answers to the serving decisions'
  questions (pure; model/sections.py);
- `components.py`: its flags on a core role's command line and its parts inside that role's agent (agents/plugins.py:
  `add_flags(parser, role)`, `components(role, agent, args)`, parts as agents/skeleton.py defines them);
- `launch.py`: `LAUNCH`, the processes `kvtransit up` starts beside the core's (harness/up/flow_launch.py);
- `report.py`: `REPORT`, its block of the run report, its headline line, its fidelity checks (report/blocks.py);
- `metrics.py`: `FACTORIES`, its Prometheus metrics by role, declared as runtime/metrics.py declares the core's;
- `cli.py`: `register(subparsers)`, its commands;
- `rows.py`: `ROWS`, its rows of the candidate table (harness/studies/candidates/);
- `presets.py`: `PRESETS`, its sweep presets (harness/studies/sweep/plan.py);
- `deploy.py`: `DEPLOY`, what the compose, Swarm and Kubernetes testbeds add for it, or why one cannot carry it yet
  (harness/deploy/flow_deploy.py).

The rules (tests/unit/test_import_direction.py holds them): the core imports no module of a flow, only this
registry; a flow may import the core but no other flow, except one it is built on (`built_on` below); a flow's
`section.py` and `model*.py` are pure, like kvtransit/model. A new flow is one folder and one line here
(docs/flows/README.md: "Adding a flow").
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class FlowEntry:
    summary: str
    built_on: tuple[str, ...] = ()  # flows this one imports (and needs enabled beside it)


# Registry order is the order of the report's blocks and headline lines, the metrics and the sweep's columns.
FLOWS: dict[str, FlowEntry] = {
    "tier": FlowEntry("the KV tier: prefix reuse at the prefill, a KV pool behind the middlebox, warm starts"),
    "tp": FlowEntry("tensor- and expert-parallel groups: all-reduces and all-to-alls between ranks, a switch "
                    "that sums"),
    "selection": FlowEntry("query-aware selection: page summaries scored in transit, the chosen pages fetched; "
                           "remote KV in `kvtransit up`", built_on=("tier",)),
    "ring": FlowEntry("ring attention: a long prompt's KV blocks passed round a ring of GPUs, a codec on every hop"),
    "weights": FlowEntry("weight streaming: a cold start and LoRA adapters paged in over a link"),
    "ciphertext": FlowEntry("ciphertexts: ML-KEM-768 handshakes and an FHE (CKKS) layer over a shaped link"),
    "engine": FlowEntry("a real engine on the KV link: two vLLM instances hand SmolLM2's KV through the middlebox"),
}

FACES = ("section", "components", "launch", "report", "metrics", "cli", "rows", "presets", "deploy")


def package(name: str) -> str:
    if name not in FLOWS:
        raise KeyError(f"unknown flow {name!r} (flows: {', '.join(FLOWS)})")
    return f"{__name__}.{name}"


def face(name: str, face_name: str) -> ModuleType | None:
    """Flow `name`'s module `face_name` (FACES), imported now, or None if the flow has none."""
    assert face_name in FACES, face_name
    module = f"{package(name)}.{face_name}"
    if importlib.util.find_spec(module) is None:
        return None
    return importlib.import_module(module)


def faces(face_name: str) -> Iterator[tuple[str, ModuleType]]:
    """(flow, module) of every registered flow that has `face_name`, in registry order."""
    for name in FLOWS:
        module = face(name, face_name)
        if module is not None:
            yield name, module


def attribute(face_name: str, attr: str) -> Iterator[tuple[str, Any]]:
    """(flow, its module's `attr`) of every flow whose `face_name` module defines it."""
    for name, module in faces(face_name):
        value = getattr(module, attr, None)
        if value is not None:
            yield name, value
