"""A flow's part of the run report (a flow's `report.py`: REPORT), and what it is built from.

The core report (report/build.py) holds every registered flow's block under the flow's key, None when the scenario
turns the flow off, so a report's keys do not depend on the scenario. A flow's report says:

- `block(run)`: its block (`KEY`), from the client's records and every peer's /stats (None: the flow is off);
- `energy(run)`: its part of the energy block (`ENERGY`: key → label; a value None when it spent none);
- `fidelity(run)`: its checks of the `fidelity` block (model/judge/fidelity.py's rules), which the run's `faithful`
  verdict reads like the core's;
- `not_idle(run)`: hand-offs that met its traffic on the link, left out of the core's hand-off check (they did not
  find the link idle);
- `lines(report)` / `footer(report)`: its headline lines, among the core's and after them;
- `columns(report)`: its figures as a sweep's extra CSV columns.

Every default says nothing, so a flow answers only what it adds. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvtransit.model.judge import fidelity
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario


@dataclass(frozen=True)
class RunData:
    """What a run measured, as the report is built from it."""

    scenario: Scenario
    records: Sequence[RequestRecord]
    peers: Sequence[dict[str, Any]]  # every peer's /stats
    prefills: Sequence[dict[str, Any]]
    decodes: Sequence[dict[str, Any]]
    middleboxes: Sequence[dict[str, Any]]
    run_model_s: float  # the run's wall time in model seconds
    summary: Mapping[str, Any]  # the core's latency summary (model/judge/slo.py: summarise(...).as_dict())

    def of_role(self, role: str) -> list[dict[str, Any]]:
        return [s for s in self.peers if s.get("role") == role]


class FlowReport:
    KEY: ClassVar[str] = ""
    ENERGY: ClassVar[Mapping[str, str]] = {}

    def block(self, run: RunData) -> dict[str, Any] | None:
        return None

    def energy(self, run: RunData) -> dict[str, float | None]:
        return dict.fromkeys(self.ENERGY)

    def fidelity(self, run: RunData) -> dict[str, fidelity.Gap]:
        return {}

    def not_idle(self, run: RunData) -> set[int]:
        return set()

    def lines(self, report: Mapping[str, Any]) -> list[str]:
        return []

    def footer(self, report: Mapping[str, Any]) -> list[str]:
        return []

    def columns(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """Its headline figures as a sweep's extra CSV columns (harness/studies/sweep/runner.py), from a report."""
        return {}


def ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds, a figure that was not measured staying None (a sweep column's unit)."""
    return None if seconds is None else seconds * 1e3


def flow_reports() -> list[FlowReport]:
    """Every registered flow's REPORT, in registry order (kvtransit/flows/__init__.py)."""
    from kvtransit import flows  # the registry only: the core reaches a flow through it, by a string

    return [report for _, report in flows.attribute("report", "REPORT")]
