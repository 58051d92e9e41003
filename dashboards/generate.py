"""kvtransit's Grafana dashboards, as code (grafana-foundation-sdk), written to dashboards/json/.

    pip install -e '.[dashboards]'
    python dashboards/generate.py            # rewrite dashboards/json/*.json
    python dashboards/generate.py --check    # exit 1 if the committed JSON is not what this file generates

Every query reads metrics declared in src/kvtransit/runtime/metrics.py (listed in METRICS.md) or the recording
rules in prometheus/rules/recording.yml; tests/unit/test_dashboards_metric_names.py checks each one, and
tests/system/test_dashboards_queries.py runs each against a real Prometheus scraping a real run (one with the
shared KV pool, so the KV pool row has data). Rate windows
are fixed (30 s, like the recording rules) rather than $__rate_interval, so the very same text can be sent to
Prometheus' HTTP API by the tests.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DataSourceRef, Threshold, ThresholdsMode

from kvtransit.model.judge.fidelity import KERNEL_TOLERANCE, LINK_RATE_TOLERANCE
from kvtransit.runtime.metrics import TPOT_SLO_S, TTFT_SLO_S

OUT_DIR = Path(__file__).resolve().parent / "json"
# Pinned so provisioned dashboards find their datasource (dashboards/provisioning/datasources/prometheus.yml).
DATASOURCE = DataSourceRef(type_val="prometheus", uid="kvtransit-prometheus")
WINDOW = "30s"  # = the recording rules' window (prometheus/rules/recording.yml)
REFRESH = "5s"
# The SLO attainment target the alert uses (prometheus/rules/alerts.yml: DistServe's 90 %).
SLO_ATTAINMENT_TARGET = 0.90


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    """One panel: a title, what it shows and how. `line` draws a target (an SLO, a tolerance) as a red line."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    line: float | None = None
    width: int = 12
    extra: dict = field(default_factory=dict)


def _quantile(q: float, metric: str, by: str = "") -> str:
    labels = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({labels}) (rate({metric}_bucket[{WINDOW}])))"


def _rate(metric: str, by: str = "") -> str:
    inner = f"rate({metric}[{WINDOW}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def _thresholds(line: float | None) -> dashboard.ThresholdsConfig:
    steps = [Threshold(value=None, color="green")]
    if line is not None:
        steps.append(Threshold(value=line, color="red"))
    return dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)


def _panel(spec: PanelSpec, panel_id: int):
    if spec.kind == "stat":
        # The last value of the run (a stat of a counter ratio), coloured by the thresholds.
        panel = (stat.Panel().graph_mode(common.BigValueGraphMode.AREA).color_mode(common.BigValueColorMode.VALUE)
                 .reduce_options(common_builders.ReduceDataOptions().values(False).calcs(["lastNotNull"])))
    elif spec.kind == "timeseries":
        panel = (timeseries.Panel().line_width(2).fill_opacity(10)
                 .legend(common_builders.VizLegendOptions().show_legend(True)
                         .display_mode(common.LegendDisplayMode.LIST).placement(common.LegendPlacement.BOTTOM)))
        if spec.line is not None:
            panel = panel.thresholds_style(
                common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.LINE))
    else:
        raise ValueError(f"panel {spec.title!r}: unknown kind {spec.kind!r}")
    panel = (panel.id(panel_id).title(spec.title).description(spec.description).datasource(DATASOURCE).unit(spec.unit)
             .thresholds(_thresholds(spec.line)).span(spec.width).height(8))
    for ref, query in zip("ABCDEFGH", spec.queries, strict=False):
        panel = panel.with_target(
            prometheus.Dataquery().expr(query.expr).legend_format(query.legend or "__auto").ref_id(ref)
            .datasource(DATASOURCE))
    return panel


def _dashboard(uid: str, title: str, description: str, rows: list[tuple[str, list[PanelSpec]]]):
    board = (dashboard.Dashboard(title).uid(uid).description(description).tags(["kvtransit"])
             .refresh(REFRESH).time("now-15m", "now").timezone("browser").editable())
    next_id = 1  # Grafana keys panel state by id: unique within a dashboard, stable across regenerations
    for row_title, panels in rows:
        board = board.with_row(dashboard.Row(row_title).id(next_id))
        next_id += 1
        for spec in panels:
            board = board.with_panel(_panel(spec, next_id))
            next_id += 1
    return board.build()


# The client's hand-off (phase="total": the loadgen's only phase) plus decode's queue wait, over E2E.
_CLIENT_HANDOFF_SUM = 'kvtransit_handoff_seconds_sum{phase="total"}'
KV_WAIT_SHARE_EXPR = (f"({_rate(_CLIENT_HANDOFF_SUM)} + {_rate('kvtransit_decode_queue_wait_seconds_sum')}) / "
                      f"{_rate('kvtransit_e2e_seconds_sum')}")


def slo_overview():
    return _dashboard(
        "kvtransit-slo-overview", "kvtransit / SLO overview",
        "What the client sees (docs/reference.md §4): TTFT and TPOT against the SLO, attainment, goodput, outcomes.",
        [("SLO", [
            PanelSpec("SLO attainment (run)", "Share of requests that met TTFT and TPOT, since the run started.",
                      (Query("kvtransit:slo_attainment:ratio"),), unit="percentunit", kind="stat",
                      line=None, width=6),
            PanelSpec("Goodput", "SLO-met requests per second (docs/reference.md §4).",
                      (Query("kvtransit:goodput:requests_per_second"),), unit="reqps", kind="stat", width=6),
            PanelSpec("SLO attainment (30 s)", f"Red line: the {SLO_ATTAINMENT_TARGET:.0%} target the alert uses.",
                      (Query("kvtransit:slo_attainment:ratio_rate30s", "attainment"),
                       Query("kvtransit:ttft_within_slo:ratio", "TTFT within SLO"),
                       Query("kvtransit:tpot_within_slo:ratio", "TPOT within SLO")),
                      unit="percentunit", line=SLO_ATTAINMENT_TARGET),
        ]), ("Latency", [
            PanelSpec("TTFT p50 / p99", f"Time to first token; red line: the SLO ({TTFT_SLO_S:g} s).",
                      (Query("kvtransit:ttft_seconds:p50", "p50"), Query("kvtransit:ttft_seconds:p99", "p99")),
                      unit="s", line=TTFT_SLO_S),
            PanelSpec("TPOT p50 / p99", f"Time per output token; red line: the SLO ({TPOT_SLO_S * 1e3:g} ms).",
                      (Query("kvtransit:tpot_seconds:p50", "p50"), Query("kvtransit:tpot_seconds:p99", "p99")),
                      unit="s", line=TPOT_SLO_S),
            PanelSpec("ITL and E2E p99", "Inter-token latency and end-to-end latency, p99.",
                      (Query("kvtransit:itl_seconds:p99", "ITL p99"), Query("kvtransit:e2e_seconds:p99", "E2E p99")),
                      unit="s"),
            PanelSpec("Hand-off p99 (client view)", "KV ready at decode - first token, as the loadgen sees it.",
                      (Query(_quantile(0.99, "kvtransit_handoff_seconds", "phase"), "{{phase}} p99"),), unit="s"),
            PanelSpec("KV wait + transfer share of E2E",
                      "(hand-off + decode queue wait) / E2E over the last 30 s: summed times, so each request weighs "
                      "by its E2E; the run report's `kv_wait_share` is the mean of each request's own share.",
                      (Query(KV_WAIT_SHARE_EXPR, "share"),), unit="percentunit"),
        ]), ("Requests", [
            PanelSpec("Requests by outcome", "ok (SLO met), slo-miss, failed, timed-out; per second.",
                      (Query("kvtransit:requests:rate30s", "{{outcome}}"),), unit="reqps"),
            PanelSpec("Requests in flight", "Sent by the loadgen and not finished yet.",
                      (Query("sum(kvtransit_requests_in_flight)", "in flight"),)),
        ])])


def link_and_module():
    return _dashboard(
        "kvtransit-link-module", "kvtransit / Link and module",
        "The shaped hand-off link and the compute-in-transit module on it (docs/reference.md §2, §5).",
        [("Link", [
            PanelSpec("Configured vs achieved rate", "Bytes/s the link is shaped to, and what it delivered.",
                      (Query("kvtransit_link_configured_rate_bytes_per_second", "{{link}} configured"),
                       Query("kvtransit_link_achieved_rate_bytes_per_second", "{{link}} achieved")),
                      unit="Bps"),
            PanelSpec("Link busy", "Occupancy over wall time (docs/reference.md §2); red line: the saturation alert.",
                      (Query("kvtransit_link_busy_ratio", "{{link}}"),), unit="percentunit", line=0.95),
            PanelSpec("Raw vs wire bytes", "KV bytes into the module and onto the link, per second.",
                      (Query(_rate("kvtransit_middlebox_kv_in_bytes_total", "link"), "{{link}} raw"),
                       Query(_rate("kvtransit_middlebox_kv_wire_bytes_total", "link"), "{{link}} wire")),
                      unit="Bps"),
            PanelSpec("Hand-off p99 by phase", "At the middlebox: queue for a channel, transfer, total.",
                      (Query("kvtransit:handoff_seconds:p99", "{{phase}}"),), unit="s"),
        ]), ("Module", [
            PanelSpec("Compression ratio", "Input bytes / output bytes (docs/reference.md §5).",
                      (Query("kvtransit:module_compression:ratio", "{{codec}}"),), unit="none", kind="stat",
                      width=6),
            PanelSpec("Module energy per request", "Modelled module energy (input bits x pJ/bit) per hand-off.",
                      (Query("kvtransit:module_energy_per_request:joules", "{{link}}"),), unit="joule",
                      kind="stat", width=6),
            PanelSpec("Transit-bound share", "Frames whose time the arithmetic budget, not the link, set.",
                      (Query("kvtransit:module_transit_bound:ratio", "{{link}}"),), unit="percentunit",
                      kind="stat", width=6),
            PanelSpec("Energy by stage", "Modelled joules per second: the link's and the module's.",
                      (Query(_rate("kvtransit_module_energy_joules_total", "stage"), "{{stage}}"),), unit="watt",
                      width=6),
            PanelSpec("Kernel compute vs modelled time", "Real host time of the kernel and the module's modelled "
                      "time for the same frames, seconds per second.",
                      (Query(_rate("kvtransit_module_kernel_compute_seconds_sum", "codec"), "{{codec}} real"),
                       Query(_rate("kvtransit_module_modelled_compute_seconds_total", "codec"), "{{codec}} modelled")),
                      unit="percentunit"),
            PanelSpec("Module operations", "Modelled operations charged against the budget, per second.",
                      (Query(_rate("kvtransit_module_ops_total", "codec"), "{{codec}}"),), unit="ops"),
        ])])


def agents():
    return _dashboard(
        "kvtransit-agents", "kvtransit / Agents",
        "Prefill and decode instances: batches, queues, step times, KV occupancy (docs/reference.md §3, §4); the "
        "shared KV pool, with --kv-pool pool.",
        [("Prefill", [
            PanelSpec("Prefill batch size", "Requests per prefill step (finished requests / steps).",
                      (Query(f"{_rate('kvtransit_prefill_requests_total')} / "
                             f"{_rate('kvtransit_prefill_step_seconds_count')}", "requests per step"),)),
            PanelSpec("Prefill queue", "Prompt tokens waiting (the router's load figure) and KV held until acked.",
                      (Query("sum(kvtransit_prefill_queued_tokens)", "queued tokens"),
                       Query("sum(kvtransit_prefill_kv_held_bytes)", "KV held bytes")), unit="short"),
            PanelSpec("Prefill step time", "Step time held (roofline), p50 and p99.",
                      (Query(_quantile(0.5, "kvtransit_prefill_step_seconds"), "p50"),
                       Query(_quantile(0.99, "kvtransit_prefill_step_seconds"), "p99")), unit="s"),
            PanelSpec("Prefill KV sent", "KV bytes streamed towards decode, per second.",
                      (Query(_rate("kvtransit_prefill_kv_sent_bytes_total", "codec"), "{{codec}}"),), unit="Bps"),
        ]), ("Decode", [
            PanelSpec("Decode batch size", "Running sequences (the continuous batch) and tokens per step.",
                      (Query("sum(kvtransit_decode_running_sequences)", "running"),
                       Query(f"{_rate('kvtransit_decode_tokens_total')} / "
                             f"{_rate('kvtransit_decode_step_seconds_count')}", "tokens per step"))),
            PanelSpec("Decode queue", "Requests whose KV arrived, waiting for admission.",
                      (Query("sum(kvtransit_decode_waiting_requests)", "waiting"),)),
            PanelSpec("Decode step time", "Step time held (roofline), p50 and p99; red line: the TPOT SLO.",
                      (Query(_quantile(0.5, "kvtransit_decode_step_seconds"), "p50"),
                       Query(_quantile(0.99, "kvtransit_decode_step_seconds"), "p99")), unit="s", line=TPOT_SLO_S),
            PanelSpec("KV occupancy", "KV tokens reserved by running sequences (prompt + output).",
                      (Query("sum(kvtransit_decode_kv_reserved_tokens)", "reserved tokens"),)),
            PanelSpec("GPU energy", "Modelled dynamic GPU energy, joules per second.",
                      (Query(_rate("kvtransit_prefill_gpu_energy_joules_total"), "prefill"),
                       Query(_rate("kvtransit_decode_gpu_energy_joules_total"), "decode")), unit="watt"),
        ]), ("KV pool", kv_pool_panels()), ("Collectives", collectives_panels()), ("Remote KV", remote_kv_panels()),
         ("Ring attention", ring_panels())])


def collectives_panels() -> list[PanelSpec]:
    """A prefill or decode TP group's collectives (`--prefill-tp`, `--decode-tp N`, flows/tp/group/steps.py); empty
    without one. Model seconds, as the run report's `collectives` block gives them."""
    return [
        PanelSpec("Collective share of the step", "A TP group's collective time over its step time, last 30 s, by "
                  "role: measured (compute held -> step end, the real all-reduce over the scale-up link included) "
                  "next to the model's (docs/reference.md §7); the run is not faithful when they are more than 3 "
                  "points apart.",
                  (Query(f"{_rate('kvtransit_tp_collective_seconds_total', 'role, source')} / "
                         f"{_rate('kvtransit_tp_step_seconds_total', 'role, source')}", "{{role}} {{source}}"),),
                  unit="percentunit"),
        PanelSpec("TP step time, measured vs model", "A TP group's step time per second of run (model seconds, "
                  "by role): the measured and the modelled lines agree when the host keeps up.",
                  (Query(_rate("kvtransit_tp_step_seconds_total", "role, source"), "{{role}} {{source}}"),),
                  unit="none"),
        PanelSpec("Switch: streams merged", "--allreduce switch: ingress streams the switch summed into one, per "
                  "second (n per all-reduce of a group of n: the placement test's streams seen).",
                  (Query(_rate("kvtransit_switch_merged_streams_total"), "merged"),), unit="ops"),
        PanelSpec("Collective frames late", "How late the real collectives' frames reached rank 0 after their due "
                  "time on the modelled scale-up link, seconds per second, by role: what this host added to the "
                  "model.",
                  (Query(_rate("kvtransit_tp_collective_late_seconds_total", "role"), "{{role}}"),), unit="none"),
    ]


def remote_kv_panels() -> list[PanelSpec]:
    """The long-context class's remote KV (`--kv-placement remote`, flows/selection/decode_legs.py): each decode step's
    legs to the KV pool through the middlebox over the decode link; empty without it. Model units, as the run
    report's `remote_kv` block gives them."""
    steps = _rate("kvtransit_remote_kv_steps_total")
    return [
        PanelSpec("Remote legs a step, measured vs model", "Seconds of a decode step spent fetching its long-context "
                  "requests' remote KV (query -> pages held), last 30 s: measured at decode (behind any hand-off on "
                  "the link) next to the model at the bytes moved (an idle link).",
                  (Query(f"{_rate('kvtransit_remote_kv_legs_seconds_total', 'source')} / scalar({steps})",
                         "{{source}}"),), unit="s"),
        PanelSpec("Remote KV bytes a step", "Model bytes a decode step moved over the decode link for its remote "
                  "contexts, by phase: the pages' summaries (top-k) and the chosen pages (or every token).",
                  (Query(f"{_rate('kvtransit_remote_kv_bytes_total', 'phase')} / scalar({steps})", "{{phase}}"),),
                  unit="bytes"),
        PanelSpec("Module: summaries scored", "Page summaries the module scored in transit (its MAC, "
                  "docs/reference.md §7), model bytes per second.",
                  (Query(_rate("kvtransit_remote_kv_scored_bytes_total"), "scored"),), unit="Bps"),
        PanelSpec("Remote steps", "Decode steps per second that fetched remote KV.",
                  (Query(steps, "steps"),), unit="ops"),
    ]


def ring_panels() -> list[PanelSpec]:
    """The ring class's prefill (`--ring-share`, flows/ring/group.py): each ring request's attention round the ring
    its prefill leads, measured at rank 0 beside the model's; empty without a ring class. Model units, as the run
    report's `ring` block gives them."""
    return [
        PanelSpec("Ring attention, measured over model", "A ring request's attention (L layers of blocks passed round "
                  "the ring while blockwise attention is held) as measured, over the model's time of the same "
                  "requests, last 30 s: 1 when the host keeps up; the run is not faithful past 5 % off.",
                  (Query(f"{_rate('kvtransit_ring_prompt_seconds_sum')} / "
                         f"{_rate('kvtransit_ring_prompt_model_seconds_total')}", "measured / model"),),
                  unit="none"),
        PanelSpec("Ring attention time", "A ring request's attention, p50 and p99 (model seconds).",
                  (Query(_quantile(0.5, "kvtransit_ring_prompt_seconds"), "p50"),
                   Query(_quantile(0.99, "kvtransit_ring_prompt_seconds"), "p99")), unit="s"),
        PanelSpec("Ring requests", "Ring requests' attention runs per second, by outcome (failed: the ring failed).",
                  (Query(_rate("kvtransit_ring_prompts_total", "outcome"), "{{outcome}}"),), unit="ops"),
        PanelSpec("Ring link bytes", "Block bytes rank 0 sent round the ring, model bytes per second.",
                  (Query(_rate("kvtransit_ring_hop_bytes_total"), "rank 0"),), unit="Bps"),
    ]


def kv_pool_panels() -> list[PanelSpec]:
    """The shared KV tier (`--kv-pool pool`: the kvpool process, the middlebox's pool path, the prefill's prefix
    cache); empty without it. Byte figures are model bytes, as the run report's `kv_pool` block gives them."""
    return [
        PanelSpec("Pool occupancy", "Bytes the pool holds per tier (the stored form: compact when the link "
                  "compresses), against each tier's capacity.",
                  (Query("sum by (stage) (kvtransit_kvpool_stored_bytes)", "{{stage}} held"),
                   Query("sum by (stage) (kvtransit_kvpool_capacity_bytes)", "{{stage}} capacity")), unit="bytes"),
        PanelSpec("Pool lookups and evictions", "Fetches answered by outcome (hit: every block asked for, partial: "
                  "a leading run, miss: none) and blocks evicted (least recently used first) by tier, per second.",
                  (Query(_rate("kvtransit_kvpool_lookups_total", "outcome"), "{{outcome}}"),
                   Query(_rate("kvtransit_kvpool_evictions_total", "stage"), "{{stage}} evictions")), unit="ops"),
        PanelSpec("Prefix hit rate", "Prompt tokens whose KV came from the cache (not recomputed) over the prompt "
                  "tokens that looked up a prefix, last 30 s (the run report's token hit rate).",
                  (Query(f"{_rate('kvtransit_prefix_cached_tokens_total')} / "
                         f"{_rate('kvtransit_prefix_prompt_tokens_total')}", "hit rate"),), unit="percentunit"),
        PanelSpec("Pool link bytes, raw vs wire", "KV bytes on the pool path through the middlebox, by phase "
                  "(fetch, put) and stage (raw: before the codec, wire: on the link), per second.",
                  (Query(_rate("kvtransit_pool_relay_bytes_total", "phase, stage"), "{{phase}} {{stage}}"),),
                  unit="Bps"),
        PanelSpec("Pool transfer and fetch p99", "Time a fetch or put held the pool link (middlebox), and a "
                  "prefill's fetch from request to last block (part of its TTFT); model seconds.",
                  (Query(_quantile(0.99, "kvtransit_pool_relay_transfer_seconds", "phase"), "{{phase}} on the link"),
                   Query(_quantile(0.99, "kvtransit_prefix_fetch_seconds"), "prefill fetch")), unit="s"),
        PanelSpec("Pool relays by outcome", "Fetches and puts the middlebox relayed, by outcome, per second.",
                  (Query(_rate("kvtransit_pool_relay_requests_total", "phase, outcome"), "{{phase}} {{outcome}}"),),
                  unit="reqps"),
    ]


def fidelity():
    return _dashboard(
        "kvtransit-fidelity", "kvtransit / Fidelity",
        "Did the host emulate what the scenario asked (ARCHITECTURE.md, time and scale; model/judge/fidelity.py)? "
        "Red lines: tolerances.",
        [("Fidelity", [
            PanelSpec("Link: achieved / configured", f"1 is exact; below {1 - LINK_RATE_TOLERANCE:g} the run "
                      "is not faithful.",
                      (Query("kvtransit:link_rate_achieved_over_configured:ratio", "{{link}}"),), unit="percentunit",
                      line=1 - LINK_RATE_TOLERANCE),
            PanelSpec("Kernel: real time / link time", f"Real kernel time over the link time of the same bytes; "
                      f"above {KERNEL_TOLERANCE:g} the kernel holds the stream back.",
                      (Query("kvtransit:kernel_compute_over_link_time:ratio", "{{link}}"),), unit="none",
                      line=KERNEL_TOLERANCE),
            PanelSpec("Timer lateness p99", "How late model-time wake-ups were, by agent role.",
                      (Query(_quantile(0.99, "kvtransit_timer_lateness_seconds", "role"), "{{role}}"),), unit="s"),
            PanelSpec("Codec reconstruction error", "Relative error of K and V after the codec, on sampled requests.",
                      (Query("kvtransit_decode_codec_relative_error", "{{codec}} {{stage}}"),), unit="percentunit"),
            PanelSpec("Real model: top-1 agreement", "--kv-sample real --accuracy model: share of scored tokens whose "
                      "next-token prediction over the KV that crossed the link equals the one over the KV the prefill "
                      "sent (the real model reading both; 1 = the link and kernel changed nothing it predicts).",
                      (Query("kvtransit_decode_model_top1_agreement", "{{codec}}"),), unit="percentunit", line=1.0),
            PanelSpec("Real model: KL(sent || arrived)", "--kv-sample real --accuracy model: mean KL divergence of "
                      "the real model's next-token distributions, sent KV against arrived KV, per scored token (nats).",
                      (Query("kvtransit_decode_model_kl_nats", "{{codec}}"),), unit="none"),
            PanelSpec("Scrape targets up", "1 per process Prometheus scrapes; 0 when one is down.",
                      (Query('up{job="kvtransit"}', "{{agent}}"),)),
        ])])


DASHBOARDS = {
    "kvtransit-slo-overview": slo_overview,
    "kvtransit-link-module": link_and_module,
    "kvtransit-agents": agents,
    "kvtransit-fidelity": fidelity,
}


def render(build) -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if dashboards/json/ is not up to date")
    args = parser.parse_args(argv)
    stale = []
    OUT_DIR.mkdir(exist_ok=True)
    for uid, build in DASHBOARDS.items():
        path = OUT_DIR / f"{uid}.json"
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)} (run python dashboards/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
