"""Request streams whose prompts share prefixes, with the hash ids of their KV blocks (flows/tier/prefix.py).

Both follow docs/reference.md §4's generator conventions: one `random.Random(seed)`, a fixed call order per request
(or per session), lengths from `LengthDist.sample`.

- **System prompts** (`system_prompts`): N shared system prompts of L tokens each; per request, in order:
  `t += rng.expovariate(rate)`, then the system prompt `rng.randrange(N)`, then the user's part
  `user.sample(rng)`, then `output.sample(rng)`. Prompt = L + user tokens. The blocks wholly inside the
  system prompt are shared (chained on ("system", p, k)); the rest are the request's own.
- **Multi-turn sessions** (`sessions`): per session, in order: `t += rng.expovariate(rate)` (session start),
  then for each turn: the user's message `user.sample(rng)`, the reply `output.sample(rng)`, and (after every
  turn but the last) the think time `rng.expovariate(1 / think_time_s)` before the next turn arrives. Turn
  j's prompt is the whole conversation so far (every earlier message and reply) plus its new message, so each
  turn's prompt extends the previous one's: every full block chains on ("session", s, k) and is shared with
  the later turns (a partial last block is the turn's own). Requests are numbered in arrival order.

The Mooncake traces carry their own `hash_ids` (model/serving/traces.py keeps them on each RequestSpec).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtransit.flows.tier.prefix import chain_hash
from kvtransit.model.errors import ConfigError
from kvtransit.model.serving.traces import BLOCK_TOKENS
from kvtransit.model.serving.workload import DEFAULT_MAX_TOKENS, LengthDist, RequestSpec

if TYPE_CHECKING:  # section.py imports this module
    from kvtransit.flows.tier.section import TierSection
    from kvtransit.model.scenario import Scenario

PREFIX_WORKLOADS = ("none", "system-prompts", "sessions")


def _ids(owner_shared: tuple[object, ...], shared_tokens: int, owner_own: tuple[object, ...], prompt_tokens: int,
         block_tokens: int) -> tuple[int, ...]:
    """Ids of a prompt's blocks: those wholly within its first `shared_tokens` are named by `owner_shared`
    (so other prompts with the same owner share them), the rest (a partial last one included) by
    `owner_own`."""
    ids: list[int] = []
    parent = None
    n_blocks = -(-prompt_tokens // block_tokens)
    for k in range(n_blocks):
        end = min((k + 1) * block_tokens, prompt_tokens)
        shared = end <= shared_tokens and end - k * block_tokens == block_tokens
        parent = chain_hash(parent, (*owner_shared, k) if shared else (*owner_own, k, end))
        ids.append(parent)
    return tuple(ids)


@dataclass(frozen=True)
class SystemPromptsSpec:
    rate: float
    requests: int
    prompts: int  # N shared system prompts
    prompt_tokens: int  # L tokens each
    user: LengthDist
    output: LengthDist
    seed: int = 1
    block_tokens: int = BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.prompts < 1:
            raise ConfigError(f"system prompts: need at least 1, got {self.prompts}")
        if not 1 <= self.prompt_tokens < DEFAULT_MAX_TOKENS:
            raise ConfigError(f"system prompt length must be in 1..{DEFAULT_MAX_TOKENS - 1} tokens, "
                              f"got {self.prompt_tokens}")
        if self.requests < 1 or not self.rate > 0:
            raise ConfigError(f"need requests >= 1 and rate > 0, got {self.requests} and {self.rate}")


def system_prompts(spec: SystemPromptsSpec) -> list[RequestSpec]:
    rng = random.Random(spec.seed)
    out = []
    t = 0.0
    for request_id in range(spec.requests):
        t += rng.expovariate(spec.rate)
        which = rng.randrange(spec.prompts)
        user = spec.user.sample(rng)
        output = spec.output.sample(rng)
        prompt = min(DEFAULT_MAX_TOKENS, spec.prompt_tokens + user)
        ids = _ids(("system", which), spec.prompt_tokens, ("request", request_id), prompt, spec.block_tokens)
        out.append(RequestSpec(request_id, t, prompt, output, ids))
    return out


@dataclass(frozen=True)
class SessionsSpec:
    rate: float  # sessions started per second
    requests: int  # turns in all (the last session is cut short to fit)
    turns: int  # turns per session
    think_time_s: float  # mean gap between a turn and the next (exponential)
    user: LengthDist
    output: LengthDist
    seed: int = 1
    block_tokens: int = BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.turns < 1 or self.requests < 1 or not self.rate > 0 or not self.think_time_s > 0:
            raise ConfigError(f"sessions: need turns >= 1, requests >= 1, rate > 0 and think time > 0, got "
                              f"{self.turns}, {self.requests}, {self.rate}, {self.think_time_s}")


def sessions(spec: SessionsSpec) -> list[RequestSpec]:
    rng = random.Random(spec.seed)
    drafts: list[tuple[float, int, int, tuple[int, ...]]] = []  # (arrival, prompt, output, ids)
    start = 0.0
    session = 0
    while len(drafts) < spec.requests:
        start += rng.expovariate(spec.rate)
        t, history = start, 0
        for turn in range(spec.turns):
            user = spec.user.sample(rng)
            output = spec.output.sample(rng)
            prompt = min(DEFAULT_MAX_TOKENS, history + user)
            # The conversation is one token stream: every full block of it is the same in every later turn
            # (only a partial last block is this turn's own).
            ids = _ids(("session", session), prompt, ("session", session, "turn", turn), prompt,
                       spec.block_tokens)
            drafts.append((t, prompt, output, ids))
            history = min(DEFAULT_MAX_TOKENS, prompt + output)
            if turn < spec.turns - 1:
                t += rng.expovariate(1.0 / spec.think_time_s)
            if len(drafts) == spec.requests:
                break
        session += 1
    drafts.sort(key=lambda d: d[0])
    return [RequestSpec(i, t, prompt, output, ids) for i, (t, prompt, output, ids) in enumerate(drafts)]


def prefix_requests(scenario: Scenario, tier: TierSection) -> list[RequestSpec]:
    """The requests of a scenario's `prefix_workload` ("system-prompts" or "sessions"); the user's part of each
    prompt is drawn from prompt_mean/prompt_cv, replies from output_mean/output_cv."""
    user = LengthDist(scenario.prompt_mean, scenario.prompt_cv)
    output = LengthDist(scenario.output_mean, scenario.output_cv)
    if tier.prefix_workload == "system-prompts":
        return system_prompts(SystemPromptsSpec(scenario.rate, scenario.requests, tier.system_prompts,
                                                tier.system_prompt_tokens, user, output, scenario.seed))
    if tier.prefix_workload == "sessions":
        return sessions(SessionsSpec(scenario.rate, scenario.requests, tier.session_turns, tier.think_time,
                                     user, output, scenario.seed))
    raise ConfigError(f"prefix_workload: {tier.prefix_workload!r} names no shared prefixes "
                      f"(choose from: {', '.join(PREFIX_WORKLOADS[1:])})")
