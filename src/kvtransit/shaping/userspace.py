"""The user-space shaper's pure arithmetic: a token bucket for rate, a delay line for latency and jitter.

No sockets, no clock: every call takes `now` / `sent_at` in float seconds from whatever clock the caller uses
(the middlebox's egress shaper passes loop.time(); tests pass numbers). The same LinkSpec drives this and tc.

Loss is deliberately absent. The user-space shaper works on a reliable byte stream (TCP payload): a dropped
"packet" is not observable there, and dropping bytes would corrupt the stream. Emulating what TCP would do on
loss (a retransmission timeout, a cwnd cut) would be a model, not a measurement. So backend.plan() refuses loss
without netem rather than pretend.
"""

from __future__ import annotations

import math
import random

from kvtransit.shaping.errors import ShapingError

DELAY_DISTRIBUTIONS = ("normal", "uniform", "pareto", "paretonormal")
# Pareto shape for jitter: netem's pareto table is a heavy right tail; alpha = 3 is the smallest integer shape
# with a finite variance. X ~ Pareto(3) has mean 3/2 and standard deviation sqrt(3)/2; we centre and scale it
# so the jitter has mean 0 and standard deviation jitter_s, like the other distributions.
_PARETO_ALPHA = 3.0
_PARETO_MEAN = _PARETO_ALPHA / (_PARETO_ALPHA - 1)
_PARETO_STD = math.sqrt(_PARETO_ALPHA / ((_PARETO_ALPHA - 1) ** 2 * (_PARETO_ALPHA - 2)))
# netem's paretonormal: a mix, 1/4 normal and 3/4 pareto (iproute2 netem/paretonormal.c).
_PARETONORMAL_NORMAL_SHARE = 0.25


class TokenBucket:
    """Rate limit with a bucket of `burst_bytes`, refilled at `rate_Bps`, allowed to go into debt.

    reserve(n, now) takes n bytes of tokens at once and returns when those bytes may leave: now if the bucket
    covered them, later by debt / rate otherwise. Because a later call inherits the debt, departure times are
    FIFO and a large write is paced exactly (no rounding per packet).
    """

    def __init__(self, rate_Bps: float, burst_bytes: int) -> None:
        self._check_rate(rate_Bps)
        if isinstance(burst_bytes, bool) or not isinstance(burst_bytes, int) or burst_bytes < 0:
            raise ShapingError("burst_bytes", burst_bytes, "must be an integer >= 0")
        self.rate_Bps = float(rate_Bps)
        self.burst_bytes = burst_bytes
        self._tokens = float(burst_bytes)  # negative = debt
        self._updated: float | None = None

    @staticmethod
    def _check_rate(rate_Bps: float) -> None:
        if isinstance(rate_Bps, bool) or not isinstance(rate_Bps, (int, float)) or not math.isfinite(rate_Bps) \
                or rate_Bps <= 0:
            raise ShapingError("rate_Bps", rate_Bps, "must be a finite number > 0")

    def _refill(self, now: float) -> None:
        if self._updated is None:
            self._updated = now
            return
        if now > self._updated:  # a clock that steps back refills nothing (never mints tokens)
            self._tokens = min(float(self.burst_bytes), self._tokens + (now - self._updated) * self.rate_Bps)
            self._updated = now

    def reserve(self, nbytes: int, now: float) -> float:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ShapingError("nbytes", nbytes, "must be an integer >= 0")
        self._refill(now)
        self._tokens -= nbytes
        assert self._updated is not None  # _refill set it
        at = max(now, self._updated)
        return at if self._tokens >= 0 else at + (-self._tokens) / self.rate_Bps

    def available(self, now: float) -> float:
        """Tokens in the bucket at `now` (0 when it is in debt): what a reserve made now would get at once."""
        self._refill(now)
        return max(0.0, self._tokens)

    def set_rate(self, rate_Bps: float, now: float) -> None:
        """Change the rate from `now` on: time before now refills at the old rate, the debt is paid at the new."""
        self._check_rate(rate_Bps)
        self._refill(now)
        self.rate_Bps = float(rate_Bps)


class DelayLine:
    """Per-stream latency with jitter that never reorders: release = max(previous release, sent + delay).

    The max() is what a byte stream demands (and what netem does when it must keep order): a chunk cannot
    overtake the one before it, so with jitter larger than the gap between chunks the effective delay skews
    upwards. The delay itself is floored at 0 (jitter never sends a chunk back in time).
    """

    def __init__(self, latency_s: float, jitter_s: float = 0.0, distribution: str = "normal", seed: int = 0) -> None:
        for name, value in (("latency_s", latency_s), ("jitter_s", jitter_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ShapingError(name, value, "must be a finite number >= 0")
        if distribution not in DELAY_DISTRIBUTIONS:
            raise ShapingError("distribution", distribution, f"choose one of {', '.join(DELAY_DISTRIBUTIONS)}")
        self.latency_s = float(latency_s)
        self.jitter_s = float(jitter_s)
        self.distribution = distribution
        self._rng = random.Random(seed)
        self._last_release = -math.inf

    def _jitter(self) -> float:
        if not self.jitter_s:
            return 0.0
        if self.distribution == "uniform":
            return self._rng.uniform(-self.jitter_s, self.jitter_s)
        if self.distribution == "normal" or (
                self.distribution == "paretonormal" and self._rng.random() < _PARETONORMAL_NORMAL_SHARE):
            return self._rng.gauss(0.0, self.jitter_s)
        return self.jitter_s * (self._rng.paretovariate(_PARETO_ALPHA) - _PARETO_MEAN) / _PARETO_STD

    def release_time(self, sent_at: float) -> float:
        release = max(self._last_release, sent_at + max(0.0, self.latency_s + self._jitter()))
        self._last_release = release
        return release

    def set_delay(self, latency_s: float, jitter_s: float | None = None) -> None:
        """Retune live (chaos, schedules); order is still kept against chunks already in flight."""
        DelayLine(latency_s, self.jitter_s if jitter_s is None else jitter_s)  # validate with the same rules
        self.latency_s = float(latency_s)
        if jitter_s is not None:
            self.jitter_s = float(jitter_s)
