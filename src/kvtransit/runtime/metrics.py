"""Where kvtransit's Prometheus metrics are declared (METRICS.md): the core roles' here, each flow's in its own
`metrics.py` with the same helpers and rules (a flow is one folder: kvtransit/flows/__init__.py).

Rules: namespace "kvtransit"; base units in names (_seconds, _bytes, _joules, _total); bounded labels only
(`ALLOWED_LABELS`: never a request id). Each agent role has a function that creates its metrics in a GIVEN
CollectorRegistry (client_python style: a fresh registry per test) and returns a frozen dataclass of the
metric objects. METRICS.md at the repo root documents every metric; tests/unit/test_runtime_metrics.py
checks it against what these functions declare, both ways.

METRICS.md stays the one place to read every series from: the check reads `all_metric_factories()`, the core's and
the flows' together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "kvtransit"
# The only label names a metric may carry: each has a small, fixed set of values.
# `route` and `status` are the front end's: its four routes and the HTTP status codes it answers with.
ALLOWED_LABELS = frozenset({"link", "codec", "stage", "outcome", "role", "phase", "route", "status", "source"})

# SLO thresholds (docs/reference.md §4: SLO met ⇔ TTFT ≤ 1 s and TPOT ≤ 25 ms). Buckets of the latency histograms
# contain them exactly, so "fraction within SLO" is a bucket ratio, not an interpolation.
TTFT_SLO_S = 1.0
TPOT_SLO_S = 0.025
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, TTFT_SLO_S, 1.5, 2.0, 5.0, 10.0, 30.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, TPOT_SLO_S, 0.03, 0.05, 0.1, 0.25, 1.0)
# Hand-off phases span µs (NVLink, small KV) to seconds (eth-25g, 32k tokens: 1.37 s, docs/reference.md §2).
HANDOFF_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                     5.0, 10.0)
# Timer lateness: the clock's spin holds ~1 µs; a loaded 2-core box can be ms late (see clock.py).
LATENESS_BUCKETS_S = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05)
# Real kernel compute per frame: a 1 MiB FFT band-keep is ~ms on this box; up to a 64 MiB frame.
COMPUTE_BUCKETS_S = (1e-5, 1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


def counter(registry: CollectorRegistry, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    return Counter(name, doc, labelnames=labels, namespace=NAMESPACE, registry=registry)


def gauge(registry: CollectorRegistry, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
    return Gauge(name, doc, labelnames=labels, namespace=NAMESPACE, registry=registry)


def histogram(registry: CollectorRegistry, name: str, doc: str, buckets: tuple[float, ...],
               labels: tuple[str, ...] = ()) -> Histogram:
    return Histogram(name, doc, labelnames=labels, namespace=NAMESPACE, registry=registry, buckets=buckets)


@dataclass(frozen=True)
class SharedMetrics:
    """What every agent process exports (the fidelity guard's timer view)."""

    timer_lateness_seconds: Histogram
    timer_lateness_step_share: Gauge


def shared_metrics(registry: CollectorRegistry) -> SharedMetrics:
    return SharedMetrics(
        timer_lateness_seconds=histogram(
            registry, "timer_lateness_seconds",
            "How late each model-time wake-up was (actual - deadline), by agent role.",
            LATENESS_BUCKETS_S, ("role",)),
        timer_lateness_step_share=gauge(
            registry, "timer_lateness_step_share",
            "Mean wake-up lateness over the shortest step held (wall clock): the fidelity guard's timer gap "
            "(model/judge/fidelity.py, judged against TIMER_TOLERANCE), by agent role.", ("role",)),
    )


@dataclass(frozen=True)
class MiddleboxMetrics:
    """The module on the link (ARCHITECTURE.md, the testbed; METRICS.md)."""

    kv_in_bytes: Counter
    kv_wire_bytes: Counter
    frames: Counter
    handoff_seconds: Histogram
    link_configured_rate: Gauge
    link_achieved_rate: Gauge
    link_configured_latency: Gauge
    link_busy_ratio: Gauge
    module_energy_joules: Counter
    module_ops: Counter
    kernel_compute_seconds: Histogram
    modelled_compute_seconds: Counter
    transit_bound: Counter
    requests: Counter


def link_achieved_rate_gauge(registry: CollectorRegistry) -> Gauge:
    """Declared by whichever end measures the link: the middlebox when its own token bucket shapes the rate,
    decode's receive side when tc does (`--link-backend tc`): one series per link either way."""
    return gauge(registry, "link_achieved_rate_bytes_per_second",
                  "Rate the link achieved: bytes over serialising time of finished transfers.", ("link",))


def middlebox_metrics(registry: CollectorRegistry) -> MiddleboxMetrics:
    return MiddleboxMetrics(
        kv_in_bytes=counter(
            registry, "middlebox_kv_in_bytes",
            "KV payload bytes received from prefill, before the module's kernel.", ("link", "codec")),
        kv_wire_bytes=counter(
            registry, "middlebox_kv_wire_bytes",
            "KV payload bytes put on the shaped link, after the kernel.", ("link", "codec")),
        frames=counter(
            registry, "middlebox_frames",
            "Frames handled; stage=ingress (from prefill) or egress (onto the link).", ("link", "stage")),
        handoff_seconds=histogram(
            registry, "middlebox_handoff_seconds",
            "Hand-off time at the middlebox by phase: queue (waiting for a link channel), transfer "
            "(first byte to last byte out, incl. latency), total.",
            HANDOFF_BUCKETS_S, ("link", "phase")),
        link_configured_rate=gauge(
            registry, "link_configured_rate_bytes_per_second",
            "Rate the shaped link is configured to (bytes/s, after payload scale and dilation).", ("link",)),
        link_achieved_rate=link_achieved_rate_gauge(registry),
        link_configured_latency=gauge(
            registry, "link_configured_latency_seconds",
            "One-way latency the shaped link is configured to.", ("link",)),
        link_busy_ratio=gauge(
            registry, "link_busy_ratio",
            "Sum of per-transfer occupancy over wall time since start (docs/reference.md §2; > 1 with channels).",
            ("link",)),
        module_energy_joules=counter(
            registry, "module_energy_joules",
            "Modelled energy: stage=link (wire bits x link pJ/bit) or stage=module (input bits x module "
            "pJ/bit, at both ends of a hand-off: the encoding module and the decoding one at decode's end).",
            ("link", "stage")),
        module_ops=counter(
            registry, "module_ops",
            "Modelled module operations charged against the arithmetic budget.", ("link", "codec")),
        kernel_compute_seconds=histogram(
            registry, "module_kernel_compute_seconds",
            "Real host time the kernel took per frame (measured).", COMPUTE_BUCKETS_S, ("link", "codec")),
        modelled_compute_seconds=counter(
            registry, "module_modelled_compute_seconds",
            "Time the module model prescribes for the same frames (compare with the real time).",
            ("link", "codec")),
        transit_bound=counter(
            registry, "module_transit_bound",
            "Frames where the module's arithmetic budget, not the link, set the transfer time.",
            ("link", "codec")),
        requests=counter(
            registry, "middlebox_requests",
            "Hand-offs finished at the middlebox by outcome (ok, failed, rejected).", ("outcome",)),
    )


# Decode steps span ~6 ms (llama3-8b, b=1) to ~100 ms (70B, big batches) (docs/reference.md §3 closed forms);
# prefill steps up to seconds (8,192-token batches on one GPU).
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, TPOT_SLO_S, 0.05, 0.1, 0.25, 0.5,
                  1.0, 2.5, 5.0)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, TTFT_SLO_S, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# Decode's queue wait (KV ready → admitted): under one step when the batch has room (a step boundary is at most
# a step away: ~6-100 ms, above), seconds when KV capacity or the batch limit holds requests back.
QUEUE_WAIT_BUCKETS_S = HANDOFF_BUCKETS_S


@dataclass(frozen=True)
class PrefillMetrics:
    """One prefill instance: its queue, its steps, the KV it streams."""

    requests: Counter
    queued_tokens: Gauge
    step_seconds: Histogram
    kv_sent_bytes: Counter
    kv_held_bytes: Gauge
    gpu_energy_joules: Counter
    handoff_retries: Counter


def prefill_metrics(registry: CollectorRegistry) -> PrefillMetrics:
    return PrefillMetrics(
        requests=counter(
            registry, "prefill_requests",
            "Requests a prefill instance finished, by outcome (ok: first token sent and KV acked; failed).",
            ("outcome",)),
        queued_tokens=gauge(
            registry, "prefill_queued_tokens",
            "Prompt tokens waiting in the prefill queue (the router's load figure)."),
        step_seconds=histogram(
            registry, "prefill_step_seconds",
            "Prefill step time held (model seconds: roofline, plus the codec when it runs on the GPU).",
            STEP_BUCKETS_S),
        kv_sent_bytes=counter(
            registry, "prefill_kv_sent_bytes",
            "KV payload bytes streamed towards decode (after the codec when it runs on the GPU).", ("codec",)),
        kv_held_bytes=gauge(
            registry, "prefill_kv_held_bytes",
            "KV bytes sent and not yet acknowledged by the decode side."),
        gpu_energy_joules=counter(
            registry, "prefill_gpu_energy_joules",
            "Modelled dynamic GPU energy of prefill steps (FLOPs x pJ/FLOP + HBM bytes x pJ/byte)."),
        handoff_retries=counter(
            registry, "prefill_handoff_retries",
            "KV hand-offs sent again after a link or middlebox failure (the KV was held until acked)."),
    )


@dataclass(frozen=True)
class DecodeMetrics:
    """One decode instance: KV received, the continuous batch, tokens, accuracy of the codec."""

    kv_received_bytes: Counter
    requests: Counter
    running: Gauge
    waiting: Gauge
    kv_reserved_tokens: Gauge
    step_seconds: Histogram
    tokens: Counter
    gpu_energy_joules: Counter
    codec_relative_error: Gauge
    model_top1_agreement: Gauge
    model_kl_nats: Gauge
    model_accuracy_requests: Counter
    kv_handoffs: Counter
    queue_wait_seconds: Histogram
    handoff_exposed_seconds: Histogram
    handoff_hidden_seconds: Histogram
    handoff_bytes: Counter


def decode_metrics(registry: CollectorRegistry) -> DecodeMetrics:
    return DecodeMetrics(
        kv_received_bytes=counter(
            registry, "decode_kv_received_bytes",
            "KV payload bytes received off the link (stage=wire) and what they stand for before the codec "
            "(stage=raw).", ("stage",)),
        requests=counter(
            registry, "decode_requests",
            "Requests a decode instance finished, by outcome (ok, failed).", ("outcome",)),
        running=gauge(registry, "decode_running_sequences", "Sequences in the continuous batch."),
        waiting=gauge(registry, "decode_waiting_requests", "Requests whose KV arrived, waiting for admission."),
        kv_reserved_tokens=gauge(
            registry, "decode_kv_reserved_tokens", "KV tokens reserved by running sequences (prompt + output)."),
        step_seconds=histogram(
            registry, "decode_step_seconds", "Decode step time held (model seconds, roofline).", STEP_BUCKETS_S),
        tokens=counter(registry, "decode_tokens", "Output tokens produced by decode steps."),
        gpu_energy_joules=counter(
            registry, "decode_gpu_energy_joules",
            "Modelled dynamic GPU energy of decode steps (FLOPs x pJ/FLOP + HBM bytes x pJ/byte)."),
        codec_relative_error=gauge(
            registry, "decode_codec_relative_error",
            "Mean relative reconstruction error of the codec on the sampled requests; stage=k or v.",
            ("codec", "stage")),
        model_top1_agreement=gauge(
            registry, "decode_model_top1_agreement",
            "--kv-sample real --accuracy model: share of scored tokens whose next-token argmax over the KV that "
            "arrived equals the one over the KV the prefill sent (the real model reading both), so far.",
            ("codec",)),
        model_kl_nats=gauge(
            registry, "decode_model_kl_nats",
            "--kv-sample real --accuracy model: mean KL(sent || arrived) of the real model's next-token "
            "distributions per scored token, nats, so far.", ("codec",)),
        model_accuracy_requests=counter(
            registry, "decode_model_accuracy_requests",
            "Real-KV hand-offs the real model read, by outcome (measured, failed).", ("outcome",)),
        kv_handoffs=counter(
            registry, "decode_kv_handoffs",
            "KV streams that reached decode, by outcome: taken (new request), duplicate (a retry of one already "
            "taken: dropped and acked), aborted (the stream broke or its sender gave up; dropped, never used).",
            ("outcome",)),
        queue_wait_seconds=histogram(
            registry, "decode_queue_wait_seconds",
            "KV ready at decode -> admitted into the continuous batch (model seconds), per request.",
            QUEUE_WAIT_BUCKETS_S),
        # Layer-wise streaming (model/serving/layerwise.py): the hand-off split at its first token, per request taken.
        handoff_exposed_seconds=histogram(
            registry, "decode_handoff_exposed_seconds",
            "Exposed hand-off: KV ready at decode - first token, >= 0 (model seconds), per request taken.",
            HANDOFF_BUCKETS_S),
        handoff_hidden_seconds=histogram(
            registry, "decode_handoff_hidden_seconds",
            "Hidden hand-off: first KV bytes at decode -> first token (model seconds; 0 when the KV is handed off "
            "whole), per request taken.", HANDOFF_BUCKETS_S),
        handoff_bytes=counter(
            registry, "decode_handoff_bytes",
            "KV payload bytes of taken hand-offs that reached decode before their first token (phase=hidden) or "
            "after it (phase=exposed).", ("phase",)),
    )


@dataclass(frozen=True)
class LoadgenMetrics:
    """What the client sees (docs/reference.md §4 definitions), in model seconds."""

    ttft_seconds: Histogram
    tpot_seconds: Histogram
    itl_seconds: Histogram
    e2e_seconds: Histogram
    handoff_seconds: Histogram
    requests: Counter
    in_flight: Gauge


def loadgen_metrics(registry: CollectorRegistry) -> LoadgenMetrics:
    return LoadgenMetrics(
        ttft_seconds=histogram(registry, "ttft_seconds", "Time to first token (first token - arrival).",
                                TTFT_BUCKETS_S),
        tpot_seconds=histogram(registry, "tpot_seconds",
                                "Time per output token: (finish - first token) / (output - 1).", TPOT_BUCKETS_S),
        itl_seconds=histogram(registry, "itl_seconds", "Gaps between consecutive tokens of a request.",
                               TPOT_BUCKETS_S),
        e2e_seconds=histogram(registry, "e2e_seconds", "End to end: finish - arrival.", E2E_BUCKETS_S),
        handoff_seconds=histogram(
            registry, "handoff_seconds", "KV ready at decode - first token (link queue + transfer), phase=total.",
            HANDOFF_BUCKETS_S, ("phase",)),
        requests=counter(
            registry, "requests",
            "Requests by outcome at the client: ok (SLO met), slo-miss, failed, timed-out.", ("outcome",)),
        in_flight=gauge(registry, "requests_in_flight", "Requests sent and not yet finished."),
    )


@dataclass(frozen=True)
class FrontendMetrics:
    """The OpenAI front end's answers (agents/frontend/): besides the load generator's, whose role it plays."""

    responses: Counter


def frontend_metrics(registry: CollectorRegistry) -> FrontendMetrics:
    return FrontendMetrics(
        responses=counter(
            registry, "frontend_responses",
            "Answers of the OpenAI front end, by route (completions, chat, models, health) and HTTP status.",
            ("route", "status")),
    )


# The core roles' metric factories; a flow declares its own in its `metrics.py` (FACTORIES), with these helpers.
METRIC_FACTORIES = {
    "shared": shared_metrics,
    "middlebox": middlebox_metrics,
    "prefill": prefill_metrics,
    "decode": decode_metrics,
    "loadgen": loadgen_metrics,
    "frontend": frontend_metrics,
}


def all_metric_factories() -> dict[str, Callable[[CollectorRegistry], Any]]:
    """Every metric factory, the core's and each registered flow's (kvtransit/flows: `metrics.py`), for METRICS.md's
    check and the dashboards'."""
    from kvtransit import flows  # the registry only: the core reaches a flow through it, by a string

    factories: dict[str, Callable[[CollectorRegistry], Any]] = dict(METRIC_FACTORIES)
    for _name, flow_factories in flows.attribute("metrics", "FACTORIES"):
        factories.update(flow_factories)
    return factories
