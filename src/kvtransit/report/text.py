"""The run report as text: the headline lines `kvtransit up` prints, the table of latency percentiles, the five
tests in a few lines, what is scaled, and the Markdown written beside the JSON (report.py builds the report; this
file only reads it, so a report written by an older run renders the same).

Every figure is shown in model terms, with the scale and dilation it was measured at (`scale_note`).
"""

from __future__ import annotations

from urllib.parse import quote

from kvtransit.model.scenario import REAL_MODEL_KV, SYNTHETIC_KV
from kvtransit.report.blocks import flow_reports


def module_line(config: dict) -> str | None:
    """What the module ran and whether it bound the hand-off (None when it ran nothing: codec none, GPU, host)."""
    module = config.get("module")
    if not module or module.get("runs") != "in-transit":
        return None
    terms = (f"module: {module['charged_ops_per_byte']:.2f} ops/B charged (transform "
             f"{'charged' if module['transform_charged'] else 'free'}) against a budget of "
             f"{module['budget_ops_per_byte']:.2f} ({module['budget']})")
    if module["transit_bound"]:
        return (f"{terms}: transit-bound, the module's compute takes {module['compute_over_wire']:.2f}x the wire "
                "time and sets the hand-off")
    return f"{terms}: the wire sets the hand-off"


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def table_rows(report: dict) -> list[tuple[str, str, str, str, str, str]]:
    """(metric, mean, p50, p90, p99, max) in milliseconds."""
    rows = []
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "handoff_s"):
        d = report[key]
        rows.append((key[:-2].upper(), _ms(d["mean"]), _ms(d["p50"]), _ms(d["p90"]), _ms(d["p99"]), _ms(d["max"])))
    return rows


def headline(report: dict) -> list[str]:
    req, link, energy = report["requests"], report["link"], report["energy_j"]

    def num(value, fmt="{:.3g}"):
        return "-" if value is None else fmt.format(value)

    flows = flow_reports()
    energy_labels = {key: label for flow in flows for key, label in flow.ENERGY.items()}
    lines = [
        f"requests {req['total']}: ok {req['ok']}, slo-miss {req['slo_miss']}, failed {req['failed']}, "
        f"timed out {req.get('timed_out', 0)}" + (f" ({req['failed_reasons']})" if req["failed_reasons"] else ""),
        f"SLO attainment {num(report['slo_attainment'], '{:.1%}')}, goodput {num(report['goodput_rps'])} req/s",
        (f"link {report['config']['link']}: configured {num(link['configured_Bps'])} B/s, achieved "
         f"{num(link['achieved_Bps'])} B/s, busy {num(link['busy'], '{:.1%}')}, KV {num(link['kv_bytes'])} B, "
         f"wire {num(link['wire_bytes'])} B"
         + (f"; rate by {link['backends']['rate']}, delay by {link['backends']['delay']}"
            if link.get("backends") else "")),
        *[line for line in (what_ran(report), module_line(report["config"]),
                            offered_load_line(report.get("workload") or {})) if line],
        (f"energy J: link {num(energy['link'])}, module {num(energy['module'])}, gpu {num(energy['gpu'])}"
         + "".join(f", {label} {num(energy[key])}" for key, label in energy_labels.items()
                   if energy.get(key) is not None)
         + f"; {num(report['j_per_token'])} J/token"),
        (f"accuracy ({report['accuracy']['codec']}, {report['accuracy']['sampled_requests']} sampled): "
         f"K {num(report['accuracy']['k_relative_error'])}, V {num(report['accuracy']['v_relative_error'])}"
         + (f"; equal-bytes baseline {report['accuracy']['baseline_codec']}: "
            f"K {num(report['accuracy'].get('baseline_k_relative_error'))}, "
            f"V {num(report['accuracy'].get('baseline_v_relative_error'))}"
            if report["accuracy"].get("baseline_codec") else "")),
        *[line for line in (model_accuracy_line(report["accuracy"].get("model")),
                            split_line(report.get("handoff_split"))) if line],
        *(line for flow in flows for line in flow.lines(report)),
        *verdict_lines(report.get("verdict")),
        "faithful: " + ("yes" if report["faithful"] else "NO: " + "; ".join(
            f"{k}: {v['hint']}" for k, v in report["fidelity"].items() if not v["ok"])),
    ]
    lines += [f"ERROR: {error}" for error in report.get("errors", [])]
    if overtaking := report.get("run", {}).get("tokens_overtaking"):
        lines.append(f"{overtaking} token(s) arrived before an earlier token of their request (the prefill's first "
                     "token after decode's next: a late process on a busy host); each was held and delivered in order")
    if report.get("prometheus"):
        lines.append(f"Prometheus: {report['prometheus']['url']} (stopped with the run)")
    lines += [line for flow in flows for line in flow.footer(report)]
    return lines


def model_accuracy_line(block: dict | None) -> str | None:
    """The real model's reading of the KV that crossed the link (`--kv-sample real`), in a line; None without it."""
    if not block:
        return None
    where = (f"{block['model'] or 'the real model'} on the KV that crossed the link, {block['measured']} of "
             f"{block['requests']} real-KV requests read")
    if block["measured"] == 0:
        return f"model accuracy: not measured ({where})"
    errors = f"K {block['k_relative_error']:.3g}, V {block['v_relative_error']:.3g}"
    if block["top1"] is None:
        return f"model accuracy ({where}): reconstruction {errors}"
    return (f"model accuracy ({where}, {block['scored_tokens']} tokens scored): top-1 {block['top1']:.1%}, KL "
            f"{block['kl']:.3g} nats, ppl {block['ppl']:.4g} vs {block['ppl_sent']:.4g} sent "
            f"({block['ppl_increase']:+.1%}); reconstruction {errors}")


def split_line(split: dict | None) -> str | None:
    """The hand-off split in a line; None for a report without one or without decode's figures."""
    if not split or split.get("exposed_share") is None:
        return None
    exposed = split["exposed_s"]
    mode = split["handoff"] + (f", prefill chunks of {split['prefill_chunk']}" if split.get("prefill_chunk") else "")
    bytes_share = split.get("hidden_bytes_share")
    return (f"hand-off ({mode}): exposed p50 {_ms(exposed['p50'])} ms, p99 {_ms(exposed['p99'])} ms; "
            f"{split['exposed_share']:.1%} of its time exposed, "
            + ("-" if bytes_share is None else f"{bytes_share:.1%}") + " of its bytes before the first token")


PASSED_TEXT = {True: "pass", False: "FAIL", None: "not measured"}


def passed_text(test: dict) -> str:
    """A test's outcome in a word; a test of a flow with no kernel on its link is not judged ("-")."""
    if test["passed"] is None and test["reason"].startswith("no kernel"):
        return "-"
    return PASSED_TEXT[test["passed"]]


def verdict_lines(verdict: dict | None) -> list[str]:
    """The five tests in a few lines: the verdict with each test's outcome, then the reason of each that did not
    pass (a candidate: none; no kernel: the flow's share). [] for a report without a verdict."""
    if not verdict:
        return []
    at = verdict.get("measured_at") or {}
    where = f"scale {at['scale']:.4g}, dilation {at['dilation']:g}" if at else "scale unknown"
    kernel = verdict["kernel"] or "no kernel"
    outcomes = ", ".join(f"{t['test']} {passed_text(t)}" for t in verdict["tests"])
    lines = [f"five tests ({verdict['flow']}, {kernel}, measured at {where}): {verdict['verdict']} [{outcomes}]"]
    # Without a kernel only the flow's share says anything (would a kernel here matter?).
    shown = [t for t in verdict["tests"] if (t["test"] == "bottleneck" if verdict["kernel"] is None
                                             else t["passed"] is not True)]
    lines += [f"  {t['test']}: {t['reason']}" for t in shown]
    return lines


def _kv_content(config: dict) -> str:
    sample = config.get("kv_sample", SYNTHETIC_KV)
    return {SYNTHETIC_KV: "synthetic", REAL_MODEL_KV: "synthetic and the real model's"}.get(sample,
                                                                                           f"real-sample {sample}")


def scale_note(config: dict) -> str | None:
    """What is real and what is scaled (model/scenario.py): `--scale` cuts each layer's KV channels (kv_heads ×
    head_dim), never its tokens or layers; the link's rate is cut by the same factor, so transfer times, like
    every step time, are the full-size model's. None for a config without the derived figures."""
    if "effective_scale" not in config or "kv_channels" not in config:
        return None
    scale, channels = config["effective_scale"], config["kv_channels"]
    all_channels = round(channels / scale)
    layers = config["kv_layout"][0]
    sample = config.get("kv_sample", SYNTHETIC_KV)
    if sample == SYNTHETIC_KV:
        content = "KV content synthetic"
    elif sample == REAL_MODEL_KV:
        content = (f"KV content synthetic, except the first {config.get('real_kv_requests')} requests': the real "
                   "model's own KV over real text, as many tokens as their KV's bytes at this scale")
    else:
        content = f"KV content from the real sample {sample} (channels cycled, tokens tiled)"
    if scale >= 1:
        line = f"scale 1: each request carries its real KV bytes ({all_channels} KV channels a layer); {content}"
    else:
        line = (f"scale {scale:.4g}: each request carries {scale * 100:.3g} % of its real KV bytes ({channels} of "
                f"{all_channels} KV channels a layer; every token and all {layers} layers kept, times the full-size "
                f"model's); {content}; bytes and energy reported at full size (measured bytes ×{1 / scale:.4g})")
    dilation = config.get("effective_dilation", 1.0)
    if dilation != 1:
        line += f"; dilation {dilation:g}: held ×{dilation:g} on the wall clock, reported ÷{dilation:g}"
    return line


TWIN = "twin"  # a report's `source` when the twin made it (twin/report.py)


def twin_note(report: dict) -> str:
    """What a twin run is, in the place of the scale note: no scale, no dilation, nothing measured."""
    twin = report.get("twin_run") or {}
    wall = "" if twin.get("wall_s") is None else f" in {twin['wall_s']:.3g} s of wall time"
    return (f"TWIN: the model on a virtual clock ({twin.get('events', 0)} events, {twin.get('model_s', 0):.4g} model s"
            f"{wall}); every byte at full size, no scale, no dilation; every figure here is the model's, none "
            "measured")


def what_ran(report: dict) -> str | None:
    """The scale note of a live run, the twin's note of a twin run."""
    return twin_note(report) if report.get("source") == TWIN else scale_note(report["config"])


def offered_load_line(workload: dict) -> str | None:
    """The workload's offered load against the modelled capacity, per stage (model/serving/offered_load.py)."""
    check = workload.get("offered_vs_capacity")
    if not check or check.get("offered_rps") is None:
        return None
    busy = ", ".join(f"{stage} {u:.0%}" for stage, u in check["utilisation"].items() if u is not None)
    line = f"offered load {check['offered_rps']:.3g} req/s; modelled capacity busy: {busy}"
    if check.get("overloaded"):
        line += f" (OVERLOADED: more than the modelled {check['bottleneck']} serves; its queue grows all run)"
    return line


def figure_lines(report: dict, figures_note: str | None = None) -> list[str]:
    """The Markdown's figures (`figures`: report_plots.py), each with its caption, linked relative to the report;
    else the one line saying why there are none."""
    if report.get("figures"):
        lines = ["## Figures", ""]
        for figure in report["figures"]:
            lines += [f"![{figure['title']}]({quote(figure['file'])})", "", f"*{figure['caption']}*", ""]
        return lines
    return [figures_note, ""] if figures_note else []


def to_markdown(report: dict, figures_note: str | None = None) -> str:
    """`figures_note`: the line said in place of the figures when none were drawn (write_report)."""
    twin = report.get("source") == TWIN
    lines = ["# kvtransit twin report" if twin else "# kvtransit run report", ""]
    cfg = report["config"]
    emulation = ("the twin (model only, virtual clock)" if twin else
                 f"scale {cfg['effective_scale']:.4g} ({_kv_content(cfg)} KV), dilation {cfg['effective_dilation']:g}")
    lines.append(f"{cfg['model']} on {cfg['gpus']}x {cfg['device']}, {cfg['prefill']}P{cfg['decode']}D, link "
                 f"{cfg['link']}, codec {cfg['codec']} at {cfg['compress_at']}, {emulation}. Times in model seconds; "
                 "bytes and energy at full size.")
    lines += ["", "| metric (ms) | mean | p50 | p90 | p99 | max |", "|---|---|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in table_rows(report)]
    lines += [""] + [f"- {line}" for line in headline(report)] + [""]
    lines += figure_lines(report, figures_note)
    return "\n".join(lines)
