"""The series behind the run report's figures, computed from the report's own fields.

No matplotlib here (`report_plots.py` draws): what each figure shows is decided and tested without drawing it.

- `latency_cdfs`: CDFs of TTFT and TPOT over the requests the report's summaries count (the steady window:
  the first 10 % by arrival left out, finished requests; docs/reference.md §4), each with its SLO line (the run's
  `config.ttft_slo_ms` / `tpot_slo_ms`, docs/reference.md §4's 1 s and 25 ms by default), and of the hand-off over every
  request that has one. The hand-off has no SLO; in whole mode its model line is the CDF of what the model
  prescribes for each request on an idle link (`model.fidelity.prescribed_handoff_s`: latency + wire bytes / rate,
  plus the module's terms, the very figure the report's `handoff_model` check holds it to).
- `link_occupancy`: the link's occupancy over the run. Nothing records it over time, so it is derived from the
  per-request records: a hand-off is open from its first token to its KV ready; with N open at an instant,
  min(N, lanes) are on the link and the rest queued (docs/reference.md §4: one FIFO link of `channels` lanes), and the
  busy fraction is the lanes' sending share per bin of the run. The open interval holds the link's latency too,
  so this busy fraction is at least the serialising one.
- `timeline`: arrival, first token, KV ready and finish of a sample of requests (the first by id).

Every time is in model seconds, as in the report (`per_request`: wall seconds ÷ dilation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.fidelity import prescribed_handoff_s
from kvtransit.model.judge.slo import TPOT_SLO_S, TTFT_SLO_S, WARMUP_FRACTION
from kvtransit.model.scenario import Scenario, field_names

# The requests the timeline shows: the first 20 by id (a sample), enough to see queueing build up
# and few enough that each row stays readable.
TIMELINE_SAMPLE = 20
# The busy fraction is averaged over 1/100 of the run per bin: bursts of a few hand-offs still show, and the line
# stays readable at the figure's width.
OCCUPANCY_BINS = 100
# The report's outcomes for a request that finished (model/judge/slo.py: Outcome.OK, Outcome.SLO_MISS).
FINISHED = ("ok", "slo-miss")


@dataclass(frozen=True)
class Cdf:
    """The empirical CDF: `xs` sorted (seconds), `ys[i]` the share of values ≤ xs[i], i.e. (i + 1) / n."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]


def cdf(values: Iterable[float]) -> Cdf:
    xs = tuple(sorted(float(v) for v in values if v is not None and math.isfinite(v)))
    return Cdf(xs, tuple((i + 1) / len(xs) for i in range(len(xs))))


@dataclass(frozen=True)
class LatencyCdf:
    name: str  # the figure's file stem
    metric: str  # what is on the x axis
    measured: Cdf
    line_s: float | None  # the SLO, None for the hand-off
    line_label: str | None
    model: Cdf | None  # the model's prescribed figure per request (the hand-off in whole mode), else None
    counted: str  # which requests, in words
    twin: Cdf | None = None  # the same requests on the twin (a live report's `per_request[].twin`), else None


def steady_requests(per_request: Sequence[Mapping[str, Any]],
                    warmup_fraction: float = WARMUP_FRACTION) -> list[Mapping[str, Any]]:
    """The report's steady window (model/judge/slo.py: steady_window) over `per_request`: by arrival, the first
    ⌊n × warm-up⌋ left out."""
    ordered = sorted(per_request, key=lambda r: (r["arrival_s"], r["id"]))
    return ordered[int(len(ordered) * warmup_fraction):]


def _scenario(config: Mapping[str, Any]) -> Scenario | None:
    """The run's scenario from its config block (as report.scenario_from_config); None when the block is not a
    whole one (an old or hand-made report), so the figure goes without its model line."""
    try:
        return Scenario.build(**{name: config[name] for name in field_names() if name in config})
    except (ConfigError, TypeError):
        return None


def prescribed_handoffs_s(report: Mapping[str, Any]) -> list[float] | None:
    """Each measured hand-off's prescribed figure on an idle link (model seconds), with the codec's real wire/KV
    ratio from the report's link block, as the `handoff_model` check computes it. None in a streamed run (its
    exposed part is judged by decode, per chunk) or when the report lacks what it takes."""
    config, link = report.get("config") or {}, report.get("link") or {}
    if config.get("handoff", "whole") != "whole" or config.get("prefill_chunk", 0):
        return None
    kv, wire = link.get("kv_bytes"), link.get("wire_bytes")
    scenario = _scenario(config)
    if not kv or wire is None or scenario is None:
        return None
    ratio = wire / kv
    model = scenario.model_spec
    return [prescribed_handoff_s(scenario, kv_bytes, kv_bytes * ratio)
            for kv_bytes in (float(model.kv_bytes(r["prompt_tokens"])) for r in report.get("per_request", [])
                             if r.get("handoff_s") is not None and r.get("prompt_tokens", 0) > 0)]


def latency_cdfs(report: Mapping[str, Any]) -> list[LatencyCdf]:
    config = report.get("config") or {}
    ttft_slo_s = config.get("ttft_slo_ms", TTFT_SLO_S * 1e3) / 1e3
    tpot_slo_s = config.get("tpot_slo_ms", TPOT_SLO_S * 1e3) / 1e3
    per_request = report.get("per_request", [])
    finished = [r for r in steady_requests(per_request) if r.get("outcome") in FINISHED]
    prescribed = prescribed_handoffs_s(report)
    steady = "finished requests of the steady window (first 10 % by arrival left out), as the summary counts them"

    def twin(key: str, rows: Sequence[Mapping[str, Any]]) -> Cdf | None:
        """The twin's figure of the same requests, when the live report carries it (twin/diff.py)."""
        values = [r["twin"][key] for r in rows if r.get("twin") and r["twin"].get(key) is not None]
        return cdf(values) if values else None

    return [
        LatencyCdf("ttft_cdf", "TTFT", cdf(r["ttft_s"] for r in finished), ttft_slo_s,
                   f"TTFT SLO {ttft_slo_s * 1e3:g} ms", None, steady, twin("ttft_s", finished)),
        LatencyCdf("tpot_cdf", "TPOT", cdf(r["tpot_s"] for r in finished if r.get("tpot_s") is not None),
                   tpot_slo_s, f"TPOT SLO {tpot_slo_s * 1e3:g} ms", None, steady + ", with at least two tokens",
                   twin("tpot_s", finished)),
        LatencyCdf("handoff_cdf", "hand-off (KV ready − first token)",
                   cdf(r["handoff_s"] for r in per_request if r.get("handoff_s") is not None), None, None,
                   None if prescribed is None else cdf(prescribed),
                   "every request with a hand-off (no warm-up cut, as the summary)", twin("handoff_s", per_request)),
    ]


@dataclass(frozen=True)
class Departure:
    """One request's live − twin in each stage (twin/diff.py's stages, in their order), at its arrival."""

    request_id: int
    arrival_s: float
    stage_delta_s: Mapping[str, float]


def departures(per_request: Sequence[Mapping[str, Any]]) -> list[Departure]:
    """Where a live run parted from its twin, request by request, in arrival order (a live report's
    `per_request[].twin.stage_delta_s`); [] for a report without a twin."""
    rows = sorted(per_request, key=lambda r: (r["arrival_s"], r["id"]))
    return [Departure(r["id"], r["arrival_s"], r["twin"]["stage_delta_s"]) for r in rows
            if r.get("twin") and r["twin"].get("stage_delta_s")]


def first_token_s(r: Mapping[str, Any]) -> float | None:
    return None if r.get("ttft_s") is None else r["arrival_s"] + r["ttft_s"]


def kv_ready_s(r: Mapping[str, Any]) -> float | None:
    """First token + hand-off. The hand-off is measured from the producer's first-token stamp, so this is within
    the first token's delivery to the client of the instant decode had the KV."""
    first = first_token_s(r)
    return None if first is None or r.get("handoff_s") is None else first + r["handoff_s"]


@dataclass(frozen=True)
class Occupancy:
    """The link over the run: `open[i]` hand-offs open from `times_s[i]` to `times_s[i + 1]` (the last to the
    end of the run, `end_s`); `busy[j]` the lanes' sending share in bin j of `bin_s` seconds."""

    times_s: tuple[float, ...]
    open: tuple[int, ...]
    lanes: int
    end_s: float
    bin_s: float
    busy: tuple[float, ...]

    @property
    def on_link(self) -> tuple[int, ...]:
        return tuple(min(n, self.lanes) for n in self.open)

    @property
    def queued(self) -> tuple[int, ...]:
        return tuple(max(0, n - self.lanes) for n in self.open)


def handoff_intervals(per_request: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(first token, KV ready) of each request that has both; a KV ready before the first token (a streamed
    hand-off, all hidden) leaves nothing open."""
    spans = []
    for r in per_request:
        start, end = first_token_s(r), kv_ready_s(r)
        if start is not None and end is not None and end > start:
            spans.append((start, end))
    return spans


def link_occupancy(intervals: Sequence[tuple[float, float]], *, lanes: int, end_s: float | None = None,
                   bins: int = OCCUPANCY_BINS) -> Occupancy:
    """The step function of open hand-offs from t = 0, and the busy fraction per bin (module docstring)."""
    if lanes < 1:
        raise ConfigError(f"link lanes must be >= 1, got {lanes!r}")
    # At one instant, endings before starts: a hand-off that ends as the next begins never overlaps it.
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    times, counts, n = [0.0], [0], 0
    for t, step in events:
        n += step
        if t == times[-1]:
            counts[-1] = n
        else:
            times.append(t)
            counts.append(n)
    last = max((end for _, end in intervals), default=0.0)
    end = max(end_s or 0.0, last)
    width = end / bins if end > 0 else 0.0
    sending = [0.0] * (bins if width > 0 else 0)
    for i, t0 in enumerate(times):  # each segment's lane-seconds, spread over the bins it covers
        t1 = times[i + 1] if i + 1 < len(times) else end
        level = min(counts[i], lanes) / lanes
        if level == 0 or t1 <= t0 or width == 0:
            continue
        for j in range(int(t0 // width), min(bins, math.ceil(t1 / width))):
            overlap = min(t1, (j + 1) * width) - max(t0, j * width)
            if overlap > 0:
                sending[j] += level * overlap
    return Occupancy(tuple(times), tuple(counts), lanes, end, width, tuple(s / width for s in sending))


def occupancy_of(report: Mapping[str, Any]) -> Occupancy:
    config = report.get("config") or {}
    run = report.get("run") or {}
    return link_occupancy(handoff_intervals(report.get("per_request", [])), lanes=int(config.get("channels", 1)),
                          end_s=run.get("model_s"))


@dataclass(frozen=True)
class TimelineRow:
    """One request's instants (model seconds); None for one it never reached."""

    request_id: int
    arrival_s: float
    first_token_s: float | None
    kv_ready_s: float | None
    finish_s: float | None
    outcome: str


def timeline(per_request: Sequence[Mapping[str, Any]], sample: int = TIMELINE_SAMPLE) -> list[TimelineRow]:
    rows = sorted(per_request, key=lambda r: r["id"])[:sample]
    return [TimelineRow(r["id"], r["arrival_s"], first_token_s(r), kv_ready_s(r),
                        None if r.get("e2e_s") is None else r["arrival_s"] + r["e2e_s"], r.get("outcome", "?"))
            for r in rows]


TWIN_AT = "The twin's figures: the model on a virtual clock, full size, no scale or dilation, nothing measured"


def measured_at(config: Mapping[str, Any]) -> str:
    """The house rule: every output that shows a figure says at what scale and dilation it was measured."""
    scale, dilation = config.get("effective_scale"), config.get("effective_dilation")
    if scale is None or dilation is None:
        return "Scale and dilation unknown (the report's config lacks them)"
    return (f"Measured at scale {scale:.4g}, dilation {dilation:g}; times in model seconds (wall ÷ {dilation:g}), "
            "from the load generator's per-request records")


def captions(report: Mapping[str, Any]) -> dict[str, str]:
    """Each figure's caption, by file stem."""
    config = report.get("config") or {}
    at = TWIN_AT if report.get("source") == "twin" else measured_at(config)
    lanes = int(config.get("channels", 1))
    cdfs = {c.name: c for c in latency_cdfs(report)}
    handoff_model = ("dashed: the model's prescribed hand-off of each request on an idle link (latency + wire bytes "
                     "/ rate, plus the module's terms)" if cdfs["handoff_cdf"].model is not None
                     else "no SLO and no per-request model figure for this hand-off mode")
    twin_note = ("; dotted: the same requests on the twin (the model alone on a virtual clock)"
                 if any(c.twin is not None for c in cdfs.values()) else "")
    return {
        "ttft_cdf": f"CDF of TTFT over the {cdfs['ttft_cdf'].counted}; red: the SLO{twin_note}. {at}.",
        "tpot_cdf": f"CDF of TPOT over the {cdfs['tpot_cdf'].counted}; red: the SLO{twin_note}. {at}.",
        "handoff_cdf": f"CDF of the hand-off over {cdfs['handoff_cdf'].counted}; {handoff_model}{twin_note}. {at}.",
        "link_occupancy": (
            "The link over the run, derived from the per-request records (nothing samples it over time): a "
            "hand-off is open from its first token to its KV ready (first token + hand-off); of N open, "
            f"min(N, {lanes}) are on the link ({lanes} FIFO lane{'s' if lanes != 1 else ''}) and the rest queued. "
            "Busy: the lanes' sending share per 1/100 of the run; the open span holds the link's latency too, so "
            f"it is at least the serialising share (the report's link.busy). {at}."),
        "twin_departure": (
            "Where this run parted from its twin (the same scenario on the model alone, the same requests): per "
            "request, by arrival, live − twin in each stage, stacked: prefill (TTFT), link (the hand-off), decode "
            f"admission (KV ready → admitted), decode steps (the rest of E2E). {at}; the twin's, the model's."),
        "timeline": (f"The first {TIMELINE_SAMPLE} requests by id: arrival → first token (prefill queue and step), "
                     "→ KV ready (hand-off: link queue and transfer), → finish (decode); KV ready is first token + "
                     f"hand-off. {at}."),
    }
