"""What a run is judged by: per-request latencies, SLO, and the run summary (docs/reference.md §4).

Definitions are the simulator's (`Disaggregated_Inference_Sim`, `metrics.py`), so the emulator's report and
the simulator's line up number for number:

- TTFT = first token − arrival (it excludes the hand-off).
- TPOT = (finish − first token) / (output − 1), DistServe's split: it includes the hand-off and decode
  queueing. None when output < 2.
- ITL = gaps between consecutive tokens of a request (the first gap, first → second token, holds the hand-off).
- E2E = finish − arrival.
- SLO met ⇔ TTFT ≤ 1 s and (TPOT ≤ 25 ms or TPOT is None).
- Summaries drop the first 10 % of requests by arrival (warm-up); percentiles interpolate linearly (numpy's
  default). Hand-off = KV ready − first token, over all requests (no warm-up cut).
- Goodput = SLO-met requests in the steady window / (last − first arrival in that window), seconds.
- KV wait + transfer share of E2E = the mean, over the steady window's finished requests with at least two
  output tokens, of (hand-off + decode queue wait) / E2E, where the decode queue wait is KV ready → admitted
  into decode's batch (docs/reference.md §4: admitted FIFO at a step boundary). How much of what a user waits for is the
  KV getting to, and waiting at, decode: the study's question, which no single latency above answers.

One difference, on purpose: the simulator only knows finished requests; a live run can also lose requests
(a checksum failure, a crash, a timeout). Those stay in the steady window and count as *not met*, so a
failure can never raise the attainment. With no failures the two agree exactly.

Pure: times are plain floats in seconds, passed in.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from kvtransit.model.errors import ConfigError

# SLO thresholds (docs/reference.md §4; the simulator's `ttft_slo`, `tpot_slo`).
TTFT_SLO_S = 1.0
TPOT_SLO_S = 0.025
# Fraction of the earliest requests (by arrival) left out of every summary (docs/reference.md §4; `warmup_frac`).
WARMUP_FRACTION = 0.1
# The percentiles every distribution in a report carries (the report's keys, report/build.py).
SUMMARY_PERCENTILES = (50, 90, 99)


class Outcome(enum.Enum):
    OK = "ok"  # finished within the SLO
    SLO_MISS = "slo-miss"  # finished, outside the SLO
    FAILED = "failed"  # lost on the way (with a reason)
    TIMED_OUT = "timed-out"  # never finished before the run's deadline


@dataclass
class RequestRecord:
    """One request as a client saw it. `token_times_s` holds every token's arrival, the first included."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    token_times_s: list[float] = field(default_factory=list)
    kv_ready_s: float | None = None
    failure: str | None = None  # the reason, when the request was lost
    timed_out: bool = False
    # When the producer stamped the first token (prefill's clock), if known. The hand-off is measured between
    # two producer stamps (prefill's first token, decode's KV ready), so client delivery delay stays out of it.
    first_token_stamp_s: float | None = None
    # The SLO this request is judged by (a scenario may set its own: `--goodput ttft:MS tpot:MS`).
    ttft_slo_s: float = TTFT_SLO_S
    tpot_slo_s: float = TPOT_SLO_S
    # KV ready → admitted into decode's continuous batch (decode measures it; None when not known, e.g. a
    # decode instance restarted before the run's end and took its figures with it).
    decode_wait_s: float | None = None

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def finished(self) -> bool:
        return self.failure is None and not self.timed_out and len(self.token_times_s) >= self.output_tokens

    @property
    def finish_s(self) -> float | None:
        return self.token_times_s[-1] if self.finished else None

    @property
    def ttft_s(self) -> float | None:
        first = self.first_token_s
        return None if first is None else first - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if not self.finished or self.output_tokens < 2:
            return None
        return (self.token_times_s[-1] - self.token_times_s[0]) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        times = self.token_times_s
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def e2e_s(self) -> float | None:
        finish = self.finish_s
        return None if finish is None else finish - self.arrival_s

    @property
    def handoff_s(self) -> float | None:
        first = self.first_token_stamp_s if self.first_token_stamp_s is not None else self.first_token_s
        return None if first is None or self.kv_ready_s is None else self.kv_ready_s - first

    @property
    def kv_wait_s(self) -> float | None:
        """Hand-off + decode queue wait: first token → the KV's request admitted at decode."""
        handoff = self.handoff_s
        return None if handoff is None or self.decode_wait_s is None else handoff + self.decode_wait_s

    @property
    def kv_wait_share(self) -> float | None:
        """`kv_wait_s` / E2E, for a finished request with at least two output tokens (with one, the request is
        over at its first token and the hand-off lies outside its E2E)."""
        kv_wait, e2e = self.kv_wait_s, self.e2e_s
        if kv_wait is None or e2e is None or e2e <= 0 or self.output_tokens < 2:
            return None
        return kv_wait / e2e

    @property
    def slo_met(self) -> bool:
        if not self.finished:
            return False
        tpot = self.tpot_s
        ttft = cast(float, self.ttft_s)  # finished: its first token came
        return ttft <= self.ttft_slo_s and (tpot is None or tpot <= self.tpot_slo_s)

    @property
    def outcome(self) -> Outcome:
        if self.failure is not None:
            return Outcome.FAILED
        if not self.finished:
            return Outcome.TIMED_OUT
        return Outcome.OK if self.slo_met else Outcome.SLO_MISS


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 ≤ q ≤ 100), interpolating linearly between order statistics (numpy's default,
    `method="linear"`). NaN for no values."""
    if not 0 <= q <= 100:
        raise ConfigError(f"percentile must be in 0..100, got {q!r}")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def distribution(values: Iterable[float]) -> dict[str, float]:
    """`{mean, p50, p90, p99, max}` (NaN each when there are no values)."""
    data = [float(v) for v in values]
    if not data:
        return {"mean": math.nan, **{f"p{q}": math.nan for q in SUMMARY_PERCENTILES}, "max": math.nan}
    return {
        "mean": math.fsum(data) / len(data),
        **{f"p{q}": percentile(data, q) for q in SUMMARY_PERCENTILES},
        "max": max(data),
    }


def steady_window(records: Sequence[RequestRecord], warmup_fraction: float = WARMUP_FRACTION) -> list[RequestRecord]:
    """The records a summary counts: sorted by arrival, the first ⌊n × warm-up⌋ left out."""
    if not 0 <= warmup_fraction < 1:
        raise ConfigError(f"warm-up fraction must be in [0, 1), got {warmup_fraction!r}")
    ordered = sorted(records, key=lambda r: (r.arrival_s, r.request_id))
    return ordered[int(len(ordered) * warmup_fraction):]


def kv_wait_share(records: Sequence[RequestRecord], warmup_fraction: float = WARMUP_FRACTION) -> float:
    """The KV wait + transfer share of E2E: the mean over the steady window of each request's
    `kv_wait_share` (requests without one are left out); NaN when no request has one."""
    shares = [share for r in steady_window(records, warmup_fraction) if (share := r.kv_wait_share) is not None]
    return math.fsum(shares) / len(shares) if shares else math.nan


def handoff_share(records: Sequence[RequestRecord], warmup_fraction: float = WARMUP_FRACTION) -> float:
    """The deck's "KV wait + transfer share" (slide 03's link table, docs/reference.md §4.5): Σ hand-off / Σ E2E over
    the steady window's finished requests that handed off (hand-off = KV ready − first token: the link's queue and
    the transfer; no decode queue wait), a ratio of sums. `kv_wait_share` is kvtransit's per-request mean with the
    decode queue wait in it; the two differ by +0.2 to +1 point at the deck's 8 req/s (the twin shows both,
    tests/unit/twin/test_twin_deck_tables.py). NaN when no request handed off."""
    counted = [r for r in steady_window(records, warmup_fraction)
               if r.finished and r.output_tokens >= 2 and r.handoff_s is not None and r.e2e_s]
    e2e = math.fsum(cast(float, r.e2e_s) for r in counted)
    return math.fsum(cast(float, r.handoff_s) for r in counted) / e2e if e2e > 0 else math.nan


@dataclass(frozen=True)
class Summary:
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]
    itl_s: dict[str, float]
    e2e_s: dict[str, float]
    handoff_s: dict[str, float]
    slo_attainment: float
    goodput_rps: float
    requests: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "itl_s": self.itl_s,
            "e2e_s": self.e2e_s,
            "handoff_s": self.handoff_s,
            "slo_attainment": self.slo_attainment,
            "goodput_rps": self.goodput_rps,
            "requests": self.requests,
        }


def summarise(records: Sequence[RequestRecord], warmup_fraction: float = WARMUP_FRACTION) -> Summary:
    """The run summary of the report: latency distributions, attainment, goodput, outcome counts."""
    steady = steady_window(records, warmup_fraction)
    finished = [r for r in steady if r.finished]
    met = sum(1 for r in steady if r.slo_met)
    window = steady[-1].arrival_s - steady[0].arrival_s if len(steady) > 1 else math.nan
    reasons: dict[str, int] = {}
    for r in records:
        if r.failure is not None:  # (that is, r.outcome is Outcome.FAILED)
            reasons[r.failure] = reasons.get(r.failure, 0) + 1
    counts = dict.fromkeys(Outcome, 0)
    for r in records:
        counts[r.outcome] += 1
    return Summary(
        # A finished request has a first token and a finish: its TTFT and E2E are set.
        ttft_s=distribution(cast(float, r.ttft_s) for r in finished),
        tpot_s=distribution(r.tpot_s for r in finished if r.tpot_s is not None),
        itl_s=distribution(gap for r in finished for gap in r.itl_s),
        e2e_s=distribution(cast(float, r.e2e_s) for r in finished),
        handoff_s=distribution(r.handoff_s for r in records if r.handoff_s is not None),
        slo_attainment=met / len(steady) if steady else math.nan,
        goodput_rps=met / window if window and window > 0 else math.nan,
        requests={
            "total": len(records),
            "ok": counts[Outcome.OK],
            "slo_miss": counts[Outcome.SLO_MISS],
            "failed": counts[Outcome.FAILED],
            "timed_out": counts[Outcome.TIMED_OUT],
            "failed_reasons": dict(sorted(reasons.items())),
            "measured": len(steady),
        },
    )
