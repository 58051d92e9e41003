"""The request stream, drawn exactly as the simulator draws it (docs/reference.md §4), so runs can be compared.

Per request, in this order and from one `random.Random(seed)`: the arrival gap, the prompt length, the
output length. Changing that order, or drawing anything else from the same generator, changes every
request after it; the default (Poisson) path must therefore stay exactly this.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from kvtransit.model.errors import ConfigError, require_positive

# docs/reference.md §4: lengths are clipped to [1, 32768].
DEFAULT_MIN_TOKENS = 1
DEFAULT_MAX_TOKENS = 32768
ARRIVALS = ("poisson", "gamma")


@dataclass(frozen=True)
class LengthDist:
    """A lognormal token count with the given mean and coefficient of variation (docs/reference.md §4)."""

    mean: float
    cv: float
    lo: int = DEFAULT_MIN_TOKENS
    hi: int = DEFAULT_MAX_TOKENS

    def __post_init__(self) -> None:
        require_positive("length mean", self.mean)
        if not (self.cv >= 0 and math.isfinite(self.cv)):
            raise ConfigError(f"length cv must be >= 0, got {self.cv!r}")
        if self.lo < 1:
            raise ConfigError(f"length lower bound must be >= 1, got {self.lo!r}")
        if self.hi < self.lo:
            raise ConfigError(f"length upper bound {self.hi!r} is below the lower bound {self.lo!r}")

    def _clip(self, value: float) -> int:
        return int(min(self.hi, max(self.lo, round(value))))

    def sample(self, rng: random.Random) -> int:
        """σ² = ln(1+cv²), μ = ln(mean) − σ²/2, int(min(hi, max(lo, round(lognormvariate(μ, σ))))).

        cv = 0 is a fixed length and draws nothing from `rng` (docs/reference.md §4 "cv = 0 is a fixed length";
        we read that as a short cut that leaves the generator untouched).
        """
        if self.cv == 0:
            return self._clip(self.mean)
        sigma2 = math.log1p(self.cv * self.cv)
        mu = math.log(self.mean) - sigma2 / 2
        return self._clip(rng.lognormvariate(mu, math.sqrt(sigma2)))


@dataclass(frozen=True)
class RequestSpec:
    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # Ids of the prompt's KV blocks, a hash chain (flows/tier/prefix.py); () when the workload names no prefixes.
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class WorkloadSpec:
    """docs/reference.md §4 defaults: 800 requests, prompt 2048 cv 0.5, output 256 cv 0.5, seed 1, Poisson.

    `arrival="gamma"` draws gaps from Γ(shape=burstiness, scale=1/(rate·burstiness)), as `vllm bench
    serve` does: mean gap 1/rate, burstier below 1, smoother above; burstiness 1 is Poisson in law but not
    draw for draw (gammavariate consumes the generator differently from expovariate).
    """

    rate: float  # requests per second
    requests: int = 800
    prompt: LengthDist = field(default_factory=lambda: LengthDist(2048, 0.5))
    output: LengthDist = field(default_factory=lambda: LengthDist(256, 0.5))
    seed: int = 1
    arrival: str = "poisson"
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ConfigError(f"request rate must be > 0 requests/s, got {self.rate!r}")
        if isinstance(self.requests, bool) or not isinstance(self.requests, int) or self.requests < 1:
            raise ConfigError(f"number of requests must be a positive integer, got {self.requests!r}")
        if self.arrival not in ARRIVALS:
            raise ConfigError(f"unknown arrival process {self.arrival!r} (choose from: {', '.join(ARRIVALS)})")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ConfigError(f"burstiness must be > 0, got {self.burstiness!r}")


def generate(spec: WorkloadSpec) -> list[RequestSpec]:
    rng = random.Random(spec.seed)
    if spec.arrival == "poisson":
        def next_gap() -> float:
            return rng.expovariate(spec.rate)
    else:
        scale = 1.0 / (spec.rate * spec.burstiness)

        def next_gap() -> float:
            return rng.gammavariate(spec.burstiness, scale)

    requests = []
    t = 0.0
    for request_id in range(spec.requests):
        t += next_gap()
        prompt = spec.prompt.sample(rng)
        output = spec.output.sample(rng)
        requests.append(RequestSpec(request_id, t, prompt, output))
    return requests
