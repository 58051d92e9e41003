"""Ring attention's metrics: a prefill's ring requests' attention, measured beside the model (METRICS.md)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from kvtransit.runtime.metrics import TTFT_SLO_S, counter, histogram

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
        prompt_seconds=histogram(
            registry, "ring_prompt_seconds",
            "--ring-share: a ring request's attention (its L layers round the ring, blocks passed over the ring link "
            "while blockwise attention is held), as measured at rank 0, model seconds.", RING_PROMPT_BUCKETS_S),
        prompt_model_seconds=counter(
            registry, "ring_prompt_model_seconds",
            "--ring-share: the model's attention time of the same ring requests (flows/ring/ring_class.py), model "
            "seconds: measured over model is ring_prompt_seconds_sum over this."),
        prompts=counter(
            registry, "ring_prompts",
            "--ring-share: ring requests' attention runs, by outcome (ok; failed: the ring failed, with a reason).",
            ("outcome",)),
        hop_bytes=counter(
            registry, "ring_hop_bytes",
            "--ring-share: block bytes rank 0 sent round the ring, model bytes (measured bytes / the ring's scale)."),
    )


FACTORIES = {
    "ring": ring_metrics,
}
