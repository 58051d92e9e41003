"""The TP groups' metrics: the switch's merged streams, a group's collectives as its leader measures them
(METRICS.md)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from kvtransit.runtime.metrics import counter


@dataclass(frozen=True)
class SwitchMetrics:
    """The switch middlebox (`kvtransit middlebox --placement switch`, flows/tp/switch/): the streams it merged."""

    merged_streams: Counter


def switch_metrics(registry: CollectorRegistry) -> SwitchMetrics:
    return SwitchMetrics(
        merged_streams=counter(
            registry, "switch_merged_streams",
            "Ingress streams the switch summed into one: n for each sum of a group of n (docs/reference.md §5: a "
            "kernel that combines streams needs a switch; the placement test's streams seen)."),
    )


@dataclass(frozen=True)
class TpGroupMetrics:
    """A prefill or decode instance that is a TP group (`--prefill-tp`, `--decode-tp`): its
    collectives measured beside the model's, by the role of the process that leads it (flows/tp/group/steps.py)."""

    collective_seconds: Counter
    step_seconds: Counter
    collective_late_seconds: Counter


def tp_group_metrics(registry: CollectorRegistry) -> TpGroupMetrics:
    return TpGroupMetrics(
        collective_seconds=counter(
            registry, "tp_collective_seconds",
            "--prefill-tp / --decode-tp N: the group's collective time of its steps, model seconds, by role: "
            "source=measured (compute held -> step end, as the step ran, real bytes over the scale-up link "
            "included) or model.", ("role", "source")),
        step_seconds=counter(
            registry, "tp_step_seconds",
            "--prefill-tp / --decode-tp N: the group's step time, model seconds, by role, source=measured (step start "
            "-> end) or model; the collective share is tp_collective_seconds over this.", ("role", "source")),
        collective_late_seconds=counter(
            registry, "tp_collective_late_seconds",
            "--prefill-tp / --decode-tp N: how late the real collectives' frames reached rank 0 after their due time "
            "on the modelled scale-up link, wall seconds, by role: what this host added to the model.", ("role",)),
    )


FACTORIES = {
    "switch": switch_metrics,
    "tp_group": tp_group_metrics,
}
