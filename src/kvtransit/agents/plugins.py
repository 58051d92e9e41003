"""The flows' parts of an agent, through the registry (kvtransit/flows/__init__.py): a flow's `components.py` says
which flags it adds to a role's command line (`add_flags(parser, role)`) and which parts it plugs into the role's
agent in a scenario that turns it on (`components(role, agent, args)`, `args` those flags' values by name).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, TypeVar

from kvtransit import flows
from kvtransit.agents.skeleton import Part

P = TypeVar("P", bound=Part)


def add_flow_flags(parser: argparse.ArgumentParser, role: str) -> None:
    """Every flow's flags for `role`'s command line (the flags exist whatever the scenario turns on)."""
    for _name, module in flows.faces("components"):
        add = getattr(module, "add_flags", None)
        if add is not None:
            add(parser, role)


def flow_parts(role: str, agent: Any, args: Mapping[str, Any], kind: type[P] = Part) -> list[P]:  # type: ignore[assignment]
    """The parts the flows `agent.scenario` turns on plug into `role`'s agent, in registry order; each is a `kind`
    (the role's part class, whose hooks the agent asks)."""
    enabled = set(agent.scenario.flows)
    parts: list[P] = []
    for name, module in flows.faces("components"):
        if name in enabled:
            for part in module.components(role, agent, args):
                if not isinstance(part, kind):
                    raise TypeError(f"flow {name}: a {role} part must be a {kind.__name__}, got {type(part).__name__}")
                parts.append(part)
        elif (unused := getattr(module, "refuse_unused", None)) is not None:
            unused(role, args)  # a flow's flag given to a scenario that has the flow off: a one-line error
    return parts
