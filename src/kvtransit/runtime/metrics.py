"""THE one module where kvtransit's Prometheus metrics are declared (DESIGN §5).

Rules: namespace "kvtransit"; base units in names (_seconds, _bytes, _joules, _total); bounded labels only
(`ALLOWED_LABELS`: never a request id). Each agent role has a function that creates its metrics in a GIVEN
CollectorRegistry (client_python style: a fresh registry per test) and returns a frozen dataclass of the
metric objects. METRICS.md at the repo root documents every metric; tests/unit/test_runtime_metrics.py
checks it against what these functions declare, both ways.

Why one file of ~450 lines: it is declarations only, one factory per role, and one place to read every series
from is the point (the design card's rule); splitting it by role would scatter what METRICS.md mirrors.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "kvtransit"
# The only label names a metric may carry: each has a small, fixed set of values.
# `route` and `status` are the front end's: its four routes and the HTTP status codes it answers with.
ALLOWED_LABELS = frozenset({"link", "codec", "stage", "outcome", "role", "phase", "route", "status", "source"})

# SLO thresholds (REFERENCE §4: SLO met ⇔ TTFT ≤ 1 s and TPOT ≤ 25 ms). Buckets of the latency histograms
# contain them exactly, so "fraction within SLO" is a bucket ratio, not an interpolation.
TTFT_SLO_S = 1.0
TPOT_SLO_S = 0.025
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, TTFT_SLO_S, 1.5, 2.0, 5.0, 10.0, 30.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, TPOT_SLO_S, 0.03, 0.05, 0.1, 0.25, 1.0)
# Hand-off phases span µs (NVLink, small KV) to seconds (eth-25g, 32k tokens: 1.37 s, REFERENCE §2).
HANDOFF_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                     5.0, 10.0)
# Timer lateness: the clock's spin holds ~1 µs; a loaded 2-core box can be ms late (see clock.py).
LATENESS_BUCKETS_S = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05)
# Real kernel compute per frame: a 1 MiB FFT band-keep is ~ms on this box; up to a 64 MiB frame.
COMPUTE_BUCKETS_S = (1e-5, 1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


def _counter(registry: CollectorRegistry, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    return Counter(name, doc, labelnames=labels, namespace=NAMESPACE, registry=registry)


def _gauge(registry: CollectorRegistry, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
    return Gauge(name, doc, labelnames=labels, namespace=NAMESPACE, registry=registry)


def _histogram(registry: CollectorRegistry, name: str, doc: str, buckets: tuple[float, ...],
               labels: tuple[str, ...] = ()) -> Histogram:
    return Histogram(name, doc, labelnames=labels, namespace=NAMESPACE, registry=registry, buckets=buckets)


@dataclass(frozen=True)
class SharedMetrics:
    """What every agent process exports (the fidelity guard's timer view)."""

    timer_lateness_seconds: Histogram
    timer_lateness_step_share: Gauge


def shared_metrics(registry: CollectorRegistry) -> SharedMetrics:
    return SharedMetrics(
        timer_lateness_seconds=_histogram(
            registry, "timer_lateness_seconds",
            "How late each model-time wake-up was (actual - deadline), by agent role.",
            LATENESS_BUCKETS_S, ("role",)),
        timer_lateness_step_share=_gauge(
            registry, "timer_lateness_step_share",
            "Mean wake-up lateness over the shortest step held (wall clock): the fidelity guard's timer gap "
            "(model/judge/fidelity.py, judged against TIMER_TOLERANCE), by agent role.", ("role",)),
    )


@dataclass(frozen=True)
class MiddleboxMetrics:
    """The module on the link (DESIGN §1 middlebox, §5 metrics)."""

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
    return _gauge(registry, "link_achieved_rate_bytes_per_second",
                  "Rate the link achieved: bytes over serialising time of finished transfers.", ("link",))


def middlebox_metrics(registry: CollectorRegistry) -> MiddleboxMetrics:
    return MiddleboxMetrics(
        kv_in_bytes=_counter(
            registry, "middlebox_kv_in_bytes",
            "KV payload bytes received from prefill, before the module's kernel.", ("link", "codec")),
        kv_wire_bytes=_counter(
            registry, "middlebox_kv_wire_bytes",
            "KV payload bytes put on the shaped link, after the kernel.", ("link", "codec")),
        frames=_counter(
            registry, "middlebox_frames",
            "Frames handled; stage=ingress (from prefill) or egress (onto the link).", ("link", "stage")),
        handoff_seconds=_histogram(
            registry, "middlebox_handoff_seconds",
            "Hand-off time at the middlebox by phase: queue (waiting for a link channel), transfer "
            "(first byte to last byte out, incl. latency), total.",
            HANDOFF_BUCKETS_S, ("link", "phase")),
        link_configured_rate=_gauge(
            registry, "link_configured_rate_bytes_per_second",
            "Rate the shaped link is configured to (bytes/s, after payload scale and dilation).", ("link",)),
        link_achieved_rate=link_achieved_rate_gauge(registry),
        link_configured_latency=_gauge(
            registry, "link_configured_latency_seconds",
            "One-way latency the shaped link is configured to.", ("link",)),
        link_busy_ratio=_gauge(
            registry, "link_busy_ratio",
            "Sum of per-transfer occupancy over wall time since start (REFERENCE §2; > 1 with channels).",
            ("link",)),
        module_energy_joules=_counter(
            registry, "module_energy_joules",
            "Modelled energy: stage=link (wire bits x link pJ/bit) or stage=module (input bits x module "
            "pJ/bit, at both ends of a hand-off: the encoding module and the decoding one at decode's end).",
            ("link", "stage")),
        module_ops=_counter(
            registry, "module_ops",
            "Modelled module operations charged against the arithmetic budget.", ("link", "codec")),
        kernel_compute_seconds=_histogram(
            registry, "module_kernel_compute_seconds",
            "Real host time the kernel took per frame (measured).", COMPUTE_BUCKETS_S, ("link", "codec")),
        modelled_compute_seconds=_counter(
            registry, "module_modelled_compute_seconds",
            "Time the module model prescribes for the same frames (compare with the real time).",
            ("link", "codec")),
        transit_bound=_counter(
            registry, "module_transit_bound",
            "Frames where the module's arithmetic budget, not the link, set the transfer time.",
            ("link", "codec")),
        requests=_counter(
            registry, "middlebox_requests",
            "Hand-offs finished at the middlebox by outcome (ok, failed, rejected).", ("outcome",)),
    )


# Decode steps span ~6 ms (llama3-8b, b=1) to ~100 ms (70B, big batches) (REFERENCE §3 closed forms);
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
        requests=_counter(
            registry, "prefill_requests",
            "Requests a prefill instance finished, by outcome (ok: first token sent and KV acked; failed).",
            ("outcome",)),
        queued_tokens=_gauge(
            registry, "prefill_queued_tokens",
            "Prompt tokens waiting in the prefill queue (the router's load figure)."),
        step_seconds=_histogram(
            registry, "prefill_step_seconds",
            "Prefill step time held (model seconds: roofline, plus the codec when it runs on the GPU).",
            STEP_BUCKETS_S),
        kv_sent_bytes=_counter(
            registry, "prefill_kv_sent_bytes",
            "KV payload bytes streamed towards decode (after the codec when it runs on the GPU).", ("codec",)),
        kv_held_bytes=_gauge(
            registry, "prefill_kv_held_bytes",
            "KV bytes sent and not yet acknowledged by the decode side."),
        gpu_energy_joules=_counter(
            registry, "prefill_gpu_energy_joules",
            "Modelled dynamic GPU energy of prefill steps (FLOPs x pJ/FLOP + HBM bytes x pJ/byte)."),
        handoff_retries=_counter(
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
        kv_received_bytes=_counter(
            registry, "decode_kv_received_bytes",
            "KV payload bytes received off the link (stage=wire) and what they stand for before the codec "
            "(stage=raw).", ("stage",)),
        requests=_counter(
            registry, "decode_requests",
            "Requests a decode instance finished, by outcome (ok, failed).", ("outcome",)),
        running=_gauge(registry, "decode_running_sequences", "Sequences in the continuous batch."),
        waiting=_gauge(registry, "decode_waiting_requests", "Requests whose KV arrived, waiting for admission."),
        kv_reserved_tokens=_gauge(
            registry, "decode_kv_reserved_tokens", "KV tokens reserved by running sequences (prompt + output)."),
        step_seconds=_histogram(
            registry, "decode_step_seconds", "Decode step time held (model seconds, roofline).", STEP_BUCKETS_S),
        tokens=_counter(registry, "decode_tokens", "Output tokens produced by decode steps."),
        gpu_energy_joules=_counter(
            registry, "decode_gpu_energy_joules",
            "Modelled dynamic GPU energy of decode steps (FLOPs x pJ/FLOP + HBM bytes x pJ/byte)."),
        codec_relative_error=_gauge(
            registry, "decode_codec_relative_error",
            "Mean relative reconstruction error of the codec on the sampled requests; stage=k or v.",
            ("codec", "stage")),
        model_top1_agreement=_gauge(
            registry, "decode_model_top1_agreement",
            "--kv-sample real --accuracy model: share of scored tokens whose next-token argmax over the KV that "
            "arrived equals the one over the KV the prefill sent (the real model reading both), so far.",
            ("codec",)),
        model_kl_nats=_gauge(
            registry, "decode_model_kl_nats",
            "--kv-sample real --accuracy model: mean KL(sent || arrived) of the real model's next-token "
            "distributions per scored token, nats, so far.", ("codec",)),
        model_accuracy_requests=_counter(
            registry, "decode_model_accuracy_requests",
            "Real-KV hand-offs the real model read, by outcome (measured, failed).", ("outcome",)),
        kv_handoffs=_counter(
            registry, "decode_kv_handoffs",
            "KV streams that reached decode, by outcome: taken (new request), duplicate (a retry of one already "
            "taken: dropped and acked), aborted (the stream broke or its sender gave up; dropped, never used).",
            ("outcome",)),
        queue_wait_seconds=_histogram(
            registry, "decode_queue_wait_seconds",
            "KV ready at decode -> admitted into the continuous batch (model seconds), per request.",
            QUEUE_WAIT_BUCKETS_S),
        # Issue 20 (model/serving/layerwise.py): the hand-off split at its first token, per request taken.
        handoff_exposed_seconds=_histogram(
            registry, "decode_handoff_exposed_seconds",
            "Exposed hand-off: KV ready at decode - first token, >= 0 (model seconds), per request taken.",
            HANDOFF_BUCKETS_S),
        handoff_hidden_seconds=_histogram(
            registry, "decode_handoff_hidden_seconds",
            "Hidden hand-off: first KV bytes at decode -> first token (model seconds; 0 when the KV is handed off "
            "whole), per request taken.", HANDOFF_BUCKETS_S),
        handoff_bytes=_counter(
            registry, "decode_handoff_bytes",
            "KV payload bytes of taken hand-offs that reached decode before their first token (phase=hidden) or "
            "after it (phase=exposed).", ("phase",)),
    )


@dataclass(frozen=True)
class LoadgenMetrics:
    """What the client sees (REFERENCE §4 definitions), in model seconds."""

    ttft_seconds: Histogram
    tpot_seconds: Histogram
    itl_seconds: Histogram
    e2e_seconds: Histogram
    handoff_seconds: Histogram
    requests: Counter
    in_flight: Gauge


def loadgen_metrics(registry: CollectorRegistry) -> LoadgenMetrics:
    return LoadgenMetrics(
        ttft_seconds=_histogram(registry, "ttft_seconds", "Time to first token (first token - arrival).",
                                TTFT_BUCKETS_S),
        tpot_seconds=_histogram(registry, "tpot_seconds",
                                "Time per output token: (finish - first token) / (output - 1).", TPOT_BUCKETS_S),
        itl_seconds=_histogram(registry, "itl_seconds", "Gaps between consecutive tokens of a request.",
                               TPOT_BUCKETS_S),
        e2e_seconds=_histogram(registry, "e2e_seconds", "End to end: finish - arrival.", E2E_BUCKETS_S),
        handoff_seconds=_histogram(
            registry, "handoff_seconds", "KV ready at decode - first token (link queue + transfer), phase=total.",
            HANDOFF_BUCKETS_S, ("phase",)),
        requests=_counter(
            registry, "requests",
            "Requests by outcome at the client: ok (SLO met), slo-miss, failed, timed-out.", ("outcome",)),
        in_flight=_gauge(registry, "requests_in_flight", "Requests sent and not yet finished."),
    )


# A pool fetch spans a few µs (one block over NVLink) to seconds (a 32k-token prefix over eth-25g).
POOL_FETCH_BUCKETS_S = HANDOFF_BUCKETS_S


@dataclass(frozen=True)
class KvPoolMetrics:
    """The shared KV pool: blocks held per tier, what it serves, evicts, and refuses (agents/kvpool/)."""

    blocks: Gauge
    stored_bytes: Gauge
    capacity_bytes: Gauge
    evictions: Counter
    lookups: Counter
    blocks_served: Counter
    served_bytes: Counter
    blocks_put: Counter
    bad_blocks: Counter


def kvpool_metrics(registry: CollectorRegistry) -> KvPoolMetrics:
    return KvPoolMetrics(
        blocks=_gauge(registry, "kvpool_blocks", "KV blocks held, by tier (stage=memory or disk).", ("stage",)),
        stored_bytes=_gauge(
            registry, "kvpool_stored_bytes",
            "Bytes held, by tier (stage=memory or disk), in the stored (compact when the link compresses) form.",
            ("stage",)),
        capacity_bytes=_gauge(registry, "kvpool_capacity_bytes", "Capacity of each tier (stage=memory or disk).",
                              ("stage",)),
        evictions=_counter(
            registry, "kvpool_evictions", "Blocks evicted (least recently used first) to make room, by tier.",
            ("stage",)),
        lookups=_counter(
            registry, "kvpool_lookups",
            "Fetches answered, by outcome: hit (every block asked for), partial (a leading run), miss (none).",
            ("outcome",)),
        blocks_served=_counter(
            registry, "kvpool_blocks_served", "Blocks streamed to fetchers, by the tier they came from.", ("stage",)),
        served_bytes=_counter(
            registry, "kvpool_served_bytes", "Payload bytes streamed to fetchers, as stored (compact or raw).",
            ("codec",)),
        blocks_put=_counter(
            registry, "kvpool_blocks_put",
            "Blocks written back, by outcome: stored, duplicate (already held), failed (a put whose stream broke or "
            "an Error withdrew, before or after its KvBegin; one per put, not per block).",
            ("outcome",)),
        bad_blocks=_counter(
            registry, "kvpool_bad_blocks",
            "Blocks whose CRC32C check failed on read: never served, deleted, reported as a miss.", ("stage",)),
    )


@dataclass(frozen=True)
class PrefixCacheMetrics:
    """The prefill's side of prefix reuse: tokens it did not recompute, and what fetching them cost."""

    prompt_tokens: Counter
    cached_tokens: Counter
    lookups: Counter
    fetch_bytes: Counter
    fetch_seconds: Histogram
    writeback_bytes: Counter


def prefix_cache_metrics(registry: CollectorRegistry) -> PrefixCacheMetrics:
    return PrefixCacheMetrics(
        prompt_tokens=_counter(registry, "prefix_prompt_tokens", "Prompt tokens of requests that looked up a prefix."),
        cached_tokens=_counter(
            registry, "prefix_cached_tokens",
            "Prompt tokens whose KV came from the cache (not recomputed); hit rate = this / prompt tokens."),
        lookups=_counter(
            registry, "prefix_lookups",
            "Prefix lookups by outcome: hit, miss, pool-down (no pool: recomputed), fetch-failed (recomputed).",
            ("outcome",)),
        fetch_bytes=_counter(
            registry, "prefix_fetch_bytes",
            "Fetched KV bytes: stage=raw (what they stand for) or wire (what crossed the link).", ("stage",)),
        fetch_seconds=_histogram(
            registry, "prefix_fetch_seconds",
            "Prefix fetch time, request to last block in (model seconds); part of TTFT.", POOL_FETCH_BUCKETS_S),
        writeback_bytes=_counter(
            registry, "prefix_writeback_bytes", "Raw KV bytes of new blocks written back to the pool."),
    )


@dataclass(frozen=True)
class PoolRelayMetrics:
    """The middlebox's pool path: write-backs compressed once on the way out, fetches over the link."""

    bytes: Counter
    transfer_seconds: Histogram
    requests: Counter


def pool_relay_metrics(registry: CollectorRegistry) -> PoolRelayMetrics:
    return PoolRelayMetrics(
        bytes=_counter(
            registry, "pool_relay_bytes",
            "KV bytes on the pool path by phase (fetch, put) and stage (raw: before the codec; wire: on the link).",
            ("phase", "stage")),
        transfer_seconds=_histogram(
            registry, "pool_relay_transfer_seconds",
            "Time one fetch or put occupied the pool link (queue + transfer, model seconds), by phase.",
            POOL_FETCH_BUCKETS_S, ("phase",)),
        requests=_counter(
            registry, "pool_relay_requests", "Pool fetches and puts relayed, by phase and outcome (ok, failed).",
            ("phase", "outcome")),
    )


@dataclass(frozen=True)
class FrontendMetrics:
    """The OpenAI front end's answers (agents/frontend/): besides the load generator's, whose role it plays."""

    responses: Counter


def frontend_metrics(registry: CollectorRegistry) -> FrontendMetrics:
    return FrontendMetrics(
        responses=_counter(
            registry, "frontend_responses",
            "Answers of the OpenAI front end, by route (completions, chat, models, health) and HTTP status.",
            ("route", "status")),
    )


@dataclass(frozen=True)
class SwitchMetrics:
    """The switch middlebox (`kvtransit middlebox --placement switch`, flows/tp/switch/): the streams it merged."""

    merged_streams: Counter


def switch_metrics(registry: CollectorRegistry) -> SwitchMetrics:
    return SwitchMetrics(
        merged_streams=_counter(
            registry, "switch_merged_streams",
            "Ingress streams the switch summed into one: n for each sum of a group of n (REFERENCE §5: a kernel "
            "that combines streams needs a switch; the placement test's streams seen)."),
    )


# Every role's metric factory, for METRICS.md's check (add each new role's here).
@dataclass(frozen=True)
class TpGroupMetrics:
    """A prefill or decode instance that is a TP group (`--prefill-tp`, `--decode-tp`; issue 17 part 4): its
    collectives measured beside the model's, by the role of the process that leads it (flows/tp/group/steps.py)."""

    collective_seconds: Counter
    step_seconds: Counter
    collective_late_seconds: Counter


def tp_group_metrics(registry: CollectorRegistry) -> TpGroupMetrics:
    return TpGroupMetrics(
        collective_seconds=_counter(
            registry, "tp_collective_seconds",
            "--prefill-tp / --decode-tp N: the group's collective time of its steps, model seconds, by role: "
            "source=measured (compute held -> step end, as the step ran, real bytes over the scale-up link "
            "included) or model.", ("role", "source")),
        step_seconds=_counter(
            registry, "tp_step_seconds",
            "--prefill-tp / --decode-tp N: the group's step time, model seconds, by role, source=measured (step start "
            "-> end) or model; the collective share is tp_collective_seconds over this.", ("role", "source")),
        collective_late_seconds=_counter(
            registry, "tp_collective_late_seconds",
            "--prefill-tp / --decode-tp N: how late the real collectives' frames reached rank 0 after their due time "
            "on the modelled scale-up link, wall seconds, by role: what this host added to the model.", ("role",)),
    )


@dataclass(frozen=True)
class RemoteKvMetrics:
    """Remote KV with selection (`--kv-placement remote`): decode's legs, the module's scoring (model units)."""

    steps: Counter
    bytes: Counter
    legs_seconds: Counter
    scored_bytes: Counter


def remote_kv_metrics(registry: CollectorRegistry) -> RemoteKvMetrics:
    return RemoteKvMetrics(
        steps=_counter(
            registry, "remote_kv_steps",
            "--kv-placement remote: decode steps that fetched remote KV for their long-context requests (top-k or "
            "all, as the run's --select)."),
        bytes=_counter(
            registry, "remote_kv_bytes",
            "--kv-placement remote: bytes that crossed the decode link for the remote contexts, model bytes, by leg "
            "(phase: summaries | pages).", ("phase",)),
        legs_seconds=_counter(
            registry, "remote_kv_legs_seconds",
            "--kv-placement remote: the steps' remote legs (query -> pages held), model seconds, source=measured (at "
            "decode, as they ran, behind any hand-off on the link) or model (flows/selection/remote_class.py at the "
            "bytes moved, an idle link).", ("source",)),
        scored_bytes=_counter(
            registry, "remote_kv_scored_bytes",
            "--kv-placement remote --select top-k: page summaries the module scored (its input), model bytes."),
    )


# A ring request's attention on n GPUs: the hops' ~0.1-20 ms × L layers (flows/ring/ring_class.py: 0.13 s on nvlink4
# to 1.2 s on eth-25g for the deck's 32k prompt, n = 2..8), up to seconds for longer prompts or slow links.
RING_PROMPT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, TTFT_SLO_S, 2.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class RingMetrics:
    """A prefill that leads a ring (`--ring-share`, flows/ring/ring_class.py; flows/ring/group.py): its ring
    requests' attention measured beside the model's, and what crossed the ring link from rank 0."""

    prompt_seconds: Histogram
    prompt_model_seconds: Counter
    prompts: Counter
    hop_bytes: Counter


def ring_metrics(registry: CollectorRegistry) -> RingMetrics:
    return RingMetrics(
        prompt_seconds=_histogram(
            registry, "ring_prompt_seconds",
            "--ring-share: a ring request's attention (its L layers round the ring, blocks passed over the ring link "
            "while blockwise attention is held), as measured at rank 0, model seconds.", RING_PROMPT_BUCKETS_S),
        prompt_model_seconds=_counter(
            registry, "ring_prompt_model_seconds",
            "--ring-share: the model's attention time of the same ring requests (flows/ring/ring_class.py), model "
            "seconds: measured over model is ring_prompt_seconds_sum over this."),
        prompts=_counter(
            registry, "ring_prompts",
            "--ring-share: ring requests' attention runs, by outcome (ok; failed: the ring failed, with a reason).",
            ("outcome",)),
        hop_bytes=_counter(
            registry, "ring_hop_bytes",
            "--ring-share: block bytes rank 0 sent round the ring, model bytes (measured bytes / the ring's scale)."),
    )


METRIC_FACTORIES = {
    "shared": shared_metrics,
    "middlebox": middlebox_metrics,
    "prefill": prefill_metrics,
    "decode": decode_metrics,
    "loadgen": loadgen_metrics,
    "kvpool": kvpool_metrics,
    "prefix_cache": prefix_cache_metrics,
    "pool_relay": pool_relay_metrics,
    "frontend": frontend_metrics,
    "switch": switch_metrics,
    "tp_group": tp_group_metrics,
    "remote_kv": remote_kv_metrics,
    "ring": ring_metrics,
}
