"""Query-aware selection's part of the scenario: remote KV in `kvtransit up` (`--kv-placement remote`).

A share (`remote_share`) of the requests also attends to a long context (`remote_context` tokens) whose KV lives in
the KV pool; each decode step fetches it through the middlebox over the decode link, every token (`select` "all")
or the top pages the module's scores pick ("top-k", the default: `select_budget` of the pages, by a `select_summary`
of each page of `page_size` tokens). Which requests: flows/selection/remote_class.py (`in_remote_class`); what a step
moves and how long the model says it takes: flows/selection/model.py, remote_class.py. Built on the tier: the pool
holds the contexts (`--kv-pool pool`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvtransit.flows.selection.model import (
    DEFAULT_PAGE_SIZE,
    SUMMARY_KINDS,
    SelectionStep,
    check_budget,
    check_page_size,
    scoring_budget,
)
from kvtransit.flows.selection.remote_class import KV_PLACEMENTS, SELECT_MODES, SELECT_TOP_K, in_remote_class
from kvtransit.flows.tier.section import TierSection
from kvtransit.model.errors import ConfigError
from kvtransit.model.field_checks import choice, number
from kvtransit.model.module.budget import Action, BudgetResult, Policy
from kvtransit.model.sections import Section

if TYPE_CHECKING:
    from kvtransit.model.scenario import Scenario


@dataclass(frozen=True)
class SelectionSection(Section):
    FLOW: ClassVar[str] = "selection"
    HELP: ClassVar[dict[str, str]] = {
        "kv_placement": "remote: a share of the requests also attends to a long context held in the KV pool (needs "
                        "--kv-pool pool), fetched through the middlebox over the decode link every decode step",
        "select": "remote KV: top-k (the module scores the pages' summaries, decode fetches the best; the default) "
                  "or all (every token a step, the baseline)",
        "select_budget": "top-k: the share of the pages fetched, in (0, 1] (1/16, 0.0625)",
        "select_summary": "top-k: a page's summary, mean (one key: a MAC, in the module's set) or minmax (Quest's "
                          "bound: needs a max, --policy host)",
        "page_size": "remote KV: tokens a page (divides the pool's 512-token blocks; Quest: 16)",
        "remote_context": "remote KV: tokens of each long context",
        "remote_share": "remote KV: share of the requests in the long-context class, in (0, 1]",
    }

    kv_placement: str = "local"
    select: str = ""  # top-k | all with remote KV ("": top-k); an error without it
    select_budget: float = 0.0625  # fraction of the pages fetched (docs/reference.md §7: PRISM's 16x less traffic)
    select_summary: str = "mean"  # the page summary: mean (one key, MAC) or minmax (Quest's bound: needs a max)
    page_size: int = DEFAULT_PAGE_SIZE  # tokens a page (Quest's 16, docs/reference.md §7)
    remote_context: int = 32768  # tokens of each remote context (the deck's 32k)
    remote_share: float = 0.5  # share of the requests in the long-context class

    def __post_init__(self) -> None:
        choice("kv_placement", self.kv_placement, KV_PLACEMENTS)
        if not self.remote:
            # Not remote: every other field at its default, or it would be silently ignored.
            given = [name for name in self.changed() if name != "kv_placement"]
            if given:
                raise ConfigError(f"{given[0]}: needs remote KV (--kv-placement remote --kv-pool pool); valid "
                                  f"kv_placement: {', '.join(KV_PLACEMENTS)}")
            return
        if self.select:
            choice("select", self.select, SELECT_MODES)
        choice("select_summary", self.select_summary, SUMMARY_KINDS)
        object.__setattr__(self, "page_size", number("page_size", self.page_size, lo=1, integer=True))
        try:
            check_page_size(self.page_size)
            check_budget(self.select_budget)
        except ConfigError as exc:
            name = "page_size" if "page size" in str(exc) else "select_budget"
            raise ConfigError(f"{name}: {exc}") from None
        object.__setattr__(self, "remote_context", number("remote_context", self.remote_context, lo=self.page_size,
                                                          integer=True))
        number("remote_share", self.remote_share, lo=0, hi=1, lo_open=True)

    @property
    def remote(self) -> bool:
        """A share of the requests attends to a long context held in the KV pool."""
        return self.kv_placement == "remote"

    def enabled(self, scenario: Scenario) -> bool:
        return self.remote

    def check(self, scenario: Scenario) -> None:
        if not self.remote:
            return
        tier = TierSection.of(scenario)
        if not tier.pool:
            raise ConfigError(f"kv_placement: 'remote' keeps the long contexts' KV in the KV pool: give --kv-pool pool "
                              f"(got kv_pool {tier.kv_pool!r})")
        if scenario.decode_tp > 1:
            raise ConfigError("kv_placement: remote KV with a decode TP group (--decode-tp > 1) is not built: give "
                              "--decode-tp 1")
        check = self.scoring_check(scenario)
        if check is not None and check.action is Action.REJECTED:
            raise ConfigError(f"select_summary: {self.select_summary!r} scores with {check.describe()}; give --policy "
                              f"host (decode scores it) or --select-summary mean (a MAC, in the module's set)")

    def twin_gap(self, scenario: Scenario) -> str | None:
        return ("its page scoring in transit and the chosen pages' fetches into each decode step are live only (no "
                "model of them drives a decode step yet)")

    @property
    def select_mode(self) -> str:
        """top-k or all with remote KV ("" without)."""
        return (self.select or SELECT_TOP_K) if self.remote else ""

    def selection_step(self, scenario: Scenario) -> SelectionStep:
        """One remote request's fetch a decode step, at the model's size (flows/selection/model.py)."""
        return SelectionStep(scenario.model_spec, self.remote_context,
                             self.select_budget if self.select_mode == SELECT_TOP_K else None,
                             self.select_summary, self.page_size)

    def scoring_check(self, scenario: Scenario) -> BudgetResult | None:
        """Where the page scoring runs (top-k only): the module, the host (Quest's bound under --policy host), or
        refused."""
        if self.select_mode != SELECT_TOP_K:
            return None
        return scoring_budget(scenario.model_spec, self.select_summary, scenario.module, Policy(scenario.policy))

    def scoring_occupancy(self, scenario: Scenario) -> float:
        """Link bytes per summary byte while the module scores them (> 1: transit-bound, docs/reference.md §5); 0 when
        the module does not score."""
        check = self.scoring_check(scenario)
        if check is None or check.action is not Action.IN_TRANSIT:
            return 0.0
        return check.charged_ops_per_byte / scenario.module.ops_per_byte

    def is_remote_request(self, scenario: Scenario, request_id: int) -> bool:
        return self.remote and in_remote_class(scenario.seed, request_id, self.remote_share)


SECTION = SelectionSection
