"""The tier's part of the scenario: prefix reuse and the KV pool, the workloads that share prefixes, a warm start.

- `kv_pool`: "off" (every prompt computed whole), "local" (a cache at the prefill, no fetch cost) or "pool" (the
  shared KV pool behind the middlebox: fetches pay the link and the module); `kv_pool_capacity`: model bytes it holds.
- `pool_warm` "trace": the pool starts the run holding what the trace's requests before `trace_start` left in it (an
  LRU of `kv_pool_capacity`; flows/tier/prefix_warm.py), made by the pool itself before it says it is ready.
- `prefix_workload`: N system prompts of L tokens, or multi-turn sessions of `session_turns` turns with `think_time`
  seconds between turns (flows/tier/workloads.py); the user's part of each prompt is drawn from prompt_mean and
  prompt_cv. A Mooncake trace (`--trace`) brings its own hash_ids instead.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kvtransit.flows.tier.prefix import LocalPrefixCache, local_index
from kvtransit.flows.tier.prefix_warm import POOL_WARM_MODES
from kvtransit.flows.tier.workloads import PREFIX_WORKLOADS, prefix_requests
from kvtransit.model.errors import ConfigError
from kvtransit.model.field_checks import choice, number
from kvtransit.model.sections import Section

if TYPE_CHECKING:
    from kvtransit.model.scenario import Scenario
    from kvtransit.model.sections import PrefixCache
    from kvtransit.model.serving.workload import RequestSpec

KV_POOL_MODES = ("off", "local", "pool")


@dataclass(frozen=True)
class TierSection(Section):
    FLOW: ClassVar[str] = "tier"
    HELP: ClassVar[dict[str, str]] = {
        "kv_pool": "prefix reuse: off, local (a cache at the prefill, free) or pool (kvtransit kvpool, via the "
                   "middlebox)",
        "kv_pool_capacity": "bytes (model size) the KV pool or local cache holds",
        "pool_warm": "trace: the pool starts holding what the trace's requests before --trace-start left in an LRU of "
                     "--kv-pool-capacity (of the blocks the window looks up; made by the pool before it is ready)",
        "prefix_workload": "prompts sharing prefixes: none, system-prompts (N of L tokens) or sessions (multi-turn)",
        "system_prompts": "system-prompts workload: how many distinct system prompts",
        "system_prompt_tokens": "system-prompts workload: tokens in each system prompt",
        "session_turns": "sessions workload: turns per session",
        "think_time": "sessions workload: mean seconds between a turn and the next",
    }

    kv_pool: str = "off"
    kv_pool_capacity: float = 64e9
    pool_warm: str = "off"
    prefix_workload: str = "none"
    system_prompts: int = 4
    system_prompt_tokens: int = 2048
    session_turns: int = 4
    think_time: float = 10.0

    def __post_init__(self) -> None:
        choice("kv_pool", self.kv_pool, KV_POOL_MODES)
        choice("prefix_workload", self.prefix_workload, PREFIX_WORKLOADS)
        number("kv_pool_capacity", self.kv_pool_capacity, lo=0)
        number("think_time", self.think_time, lo=0, lo_open=True)
        for name in ("system_prompts", "system_prompt_tokens", "session_turns"):
            object.__setattr__(self, name, number(name, getattr(self, name), lo=1, integer=True))
        choice("pool_warm", self.pool_warm, POOL_WARM_MODES)

    def enabled(self, scenario: Scenario) -> bool:
        return self.kv_pool != "off" or self.prefix_workload != "none"

    @property
    def pool(self) -> bool:
        """The shared KV pool behind the middlebox (a process of its own), not a cache at the prefill."""
        return self.kv_pool == "pool"

    def check(self, scenario: Scenario) -> None:
        if self.pool_warm == "trace" and (not self.pool or not scenario.trace):
            raise ConfigError(f"pool_warm: 'trace' warms the KV pool with a trace's earlier requests: give --kv-pool "
                              f"pool and --trace FILE (got kv_pool {self.kv_pool!r}, trace "
                              f"{scenario.trace or 'none'!r})")
        if self.prefix_workload != "none" and scenario.trace:
            raise ConfigError(f"prefix_workload: {self.prefix_workload!r} and a trace both name the requests; "
                              "give one (a Mooncake trace brings its own hash_ids)")

    def prefix_cache(self, scenario: Scenario) -> PrefixCache | None:
        """`local`: the prefill's own cache, the live one's rules (flows/tier/prefix.py); off or pool: none here."""
        if self.kv_pool != "local":
            return None
        return LocalPrefixCache(local_index(scenario, self.kv_pool_capacity))

    def twin_gap(self, scenario: Scenario) -> str | None:
        if self.pool:
            return ("--kv-pool pool: the pool's fetches and write-backs over its own link and the module are live only "
                    "(no model of them drives a prefill step yet; --kv-pool local runs on the twin)")
        return None  # off with a prefix workload (its requests), or local (prefix_cache)

    def brings_prompts(self) -> bool:
        return self.prefix_workload != "none"

    def requests(self, scenario: Scenario) -> list[RequestSpec] | None:
        return prefix_requests(scenario, self) if self.prefix_workload != "none" else None

    def workload(self, scenario: Scenario) -> dict[str, Any] | None:
        if self.prefix_workload == "system-prompts":
            return {"source": "system-prompts", "system_prompts": self.system_prompts,
                    "system_prompt_tokens": self.system_prompt_tokens, "rate_rps": scenario.rate,
                    "requests": scenario.requests}
        if self.prefix_workload == "sessions":
            return {"source": "sessions", "session_turns": self.session_turns, "think_time_s": self.think_time,
                    "rate_sessions_per_s": scenario.rate, "requests": scenario.requests}
        return None


SECTION = TierSection
