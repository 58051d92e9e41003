"""What `kvtransit engine` measured, set beside what the model prescribes, and the text the engine generated (pure).

Three kinds of figure, each tagged where it is shown:

- **measured on this host** (`host`): vLLM's own TTFT and TPOT as the client saw them, on this machine's CPU cores
  running SmolLM2-135M in float32. They are this host's, not an accelerator's, and are never scaled;
- **measured on the emulated link** (`link`): each hand-off from the prefill's first token to its KvEnd at the
  decode instance, in model time (wall / dilation), with the bytes that crossed; held to the model's prescription
  by model/judge/fidelity.py (`handoff_gap`, and `link_gap` on the middlebox's own meter), so `faithful` fails
  closed as everywhere else;
- **modelled** (`model`): the roofline's TTFT and TPOT of the same model and prompt on the scenario's device, and
  the link's prescribed hand-off: what the same run would take on the emulated hardware.

Agreement with the reference (a single vLLM instance, no connector): each kernel's generated tokens position by
position (`tokens_equal`: all of them), and, teacher-forced, top-1 agreement and KL(none || kernel) in nats per
token over the full vocabulary at the same positions, as `kvtransit accuracy` reports them
(docs/results/accuracy.md).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import TYPE_CHECKING, Any

from kvtransit.model.cost.roofline import decode_step_s, prefill_step_s
from kvtransit.model.judge.fidelity import assess, handoff_gap, link_gap, not_measured, prescribed_handoff_s

if TYPE_CHECKING:
    from kvtransit.flows.engine.run import EngineRun, Measured

MS = 1e3


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    """The first position where the two token sequences differ (None: equal over the shorter's length and as long)."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def kl_and_top1(reference: list[dict[str, float] | None], other: list[dict[str, float] | None]) -> dict[str, Any]:
    """Top-1 agreement and KL(reference || other), nats per position, from full-vocabulary log-probabilities
    (token → log p) position by position."""
    kls, agree = [], 0
    for ref, oth in zip(reference, other, strict=True):
        if not ref or not oth:
            continue
        kls.append(sum(math.exp(lp) * (lp - oth.get(tok, -math.inf)) for tok, lp in ref.items()
                       if math.isfinite(lp)))
        agree += max(ref, key=ref.__getitem__) == max(oth, key=oth.__getitem__)
    n = len(kls)
    return {"positions": n, "kl_nats_per_token": sum(kls) / n if n else None, "top1_agree": agree / n if n else None}


def greedy_share(logprobs: list[dict[str, float] | None], tokens: list[int]) -> float | None:
    """The share of scored positions whose most likely token is the single instance's greedy token there."""
    pairs = [(lp, t) for lp, t in zip(logprobs, tokens, strict=False) if lp]
    if not pairs:
        return None
    return sum(max(lp, key=lp.__getitem__) == str(t) for lp, t in pairs) / len(pairs)


def _records(measured: Measured) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["side"], r["request_id"]): r for r in measured.records}


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def build_report(run: EngineRun, measured: Measured, *, wall_s: float) -> dict[str, Any]:
    scenario = run.scenario
    dilation = float(scenario.dilation)
    records = _records(measured)
    model, device = scenario.model_spec, scenario.device_spec
    kernels: dict[str, Any] = {}
    handoff_measured: list[float] = []
    handoff_modelled: list[float] = []
    link_gaps = []
    none_logprobs: dict[str, list] = {}
    for kernel, block in measured.kernels.items():
        kernel_scenario = dataclasses.replace(scenario, codec=kernel)
        rows = []
        for row, reference in zip(block["prompts"], measured.reference, strict=True):
            decode, prefill = row["decode"], row["prefill"]
            ref_tokens = reference["token_ids"]
            prompt_tokens = len(next(p for p in measured.prompts if p["name"] == row["prompt"])["token_ids"])
            got = records.get(("decode", row["wire_id"]), {})
            handoff_s = None
            if got.get("outcome") == "ok" and got.get("first_token_ns"):
                handoff_s = (got["ended_ns"] - got["first_token_ns"]) / 1e9 / dilation
                modelled = prescribed_handoff_s(kernel_scenario, got["raw_bytes"], got["wire_bytes"])
                handoff_measured.append(handoff_s)
                handoff_modelled.append(modelled)
            else:
                modelled = None
            end_to_end_ttft = ((decode["first_token_ns"] - prefill["sent_ns"]) / 1e9
                               if decode.get("first_token_ns") and prefill.get("sent_ns") else None)
            out = {
                "prompt": row["prompt"], "prompt_tokens": prompt_tokens, "text": decode["text"],
                "error": decode["error"] or prefill["error"],
                "tokens_equal": decode["token_ids"] == ref_tokens,
                "token_agreement": (sum(a == b for a, b in zip(ref_tokens, decode["token_ids"], strict=False))
                                    / len(ref_tokens)) if ref_tokens else None,
                "first_divergence": first_divergence(ref_tokens, decode["token_ids"]),
                "host": {"ttft_s": end_to_end_ttft, "prefill_ttft_s": prefill["ttft_s"],
                         "decode_ttft_s": decode["ttft_s"], "tpot_s": decode["tpot_s"],
                         "reference_ttft_s": reference["ttft_s"], "reference_tpot_s": reference["tpot_s"]},
                "link": {"handoff_s": handoff_s, "raw_bytes": got.get("raw_bytes"),
                         "wire_bytes": got.get("wire_bytes"), "outcome": got.get("outcome")},
                "model": {"prefill_s": prefill_step_s(model, device, scenario.gpus, [prompt_tokens]),
                          "handoff_s": modelled,
                          "tpot_s": decode_step_s(model, device, scenario.gpus, 1,
                                                  prompt_tokens + len(ref_tokens) // 2)},
            }
            m = out["model"]
            first_step = decode_step_s(model, device, scenario.gpus, 1, prompt_tokens)
            m["ttft_s"] = m["prefill_s"] + m["handoff_s"] + first_step if m["handoff_s"] is not None else None
            scored = row.get("scored")
            if scored and "logprobs" in scored:
                if kernel == "none":
                    none_logprobs[row["prompt"]] = scored["logprobs"]
                if row["prompt"] in none_logprobs:
                    out["teacher_forced"] = {**kl_and_top1(none_logprobs[row["prompt"]], scored["logprobs"]),
                                             "single_instance_top1": greedy_share(scored["logprobs"],
                                                                                  scored["tokens"])}
            elif scored:
                out["teacher_forced"] = {"error": scored.get("error")}
            rows.append(out)
        stats = block.get("middlebox") or {}
        link = stats.get("link") or {}
        if link.get("achieved_Bps") and link.get("configured_Bps"):
            link_gaps.append(link_gap(link["achieved_Bps"], link["configured_Bps"], 1.0, dilation))
        kernels[kernel] = {"prompts": rows, "summary": _summary(rows),
                           "middlebox": {"link": link, "chain": stats.get("chain"),
                                         "requests_ok": stats.get("requests_ok"),
                                         "failed_reasons": stats.get("failed_reasons")}}
    gaps = {"handoff": handoff_gap(handoff_measured, handoff_modelled, dilation) if handoff_measured
            else not_measured("no hand-off reached the decode instance", 0.02),
            "link_rate": (max(link_gaps, key=lambda g: g.measured) if link_gaps
                          else not_measured("the middlebox reported no achieved link rate", 0.02))}
    faithful, fidelity = assess(gaps)
    reference_rows = [{"prompt": p["name"], "prompt_tokens": len(p["token_ids"]), "text": r["text"],
                       "ttft_s": r["ttft_s"], "tpot_s": r["tpot_s"]}
                      for p, r in zip(measured.prompts, measured.reference, strict=True)]
    return {
        "what": "two vLLM instances (prefill, decode) with kvtransit's KV connector, the middlebox between them",
        "engine": {"python": run.engine.python, "vllm": run.engine.vllm_version, "torch": run.engine.torch_version,
                   "model_dir": run.model_dir, "dtype": "float32", "startup_s": measured.startup_s},
        "scenario": {"model": scenario.model, "device": scenario.device, "gpus": scenario.gpus, "link": scenario.link,
                     "scale": 1.0, "dilation": dilation, "keep": scenario.keep, "sinks": scenario.sinks,
                     "block": scenario.block, "variant": scenario.variant},
        "host_note": ("host figures (TTFT, TPOT) are this machine's CPU running the real model: not an accelerator's, "
                      "not scaled; link figures are the emulated link's, measured on the wire in model time "
                      "(wall / dilation); model figures are the roofline's for the scenario's device"),
        "output_tokens": run.output_tokens, "scored_tokens": run.scored_tokens,
        "reference": reference_rows, "kernels": kernels, "corrupt": _corrupt(measured, records),
        "faithful": faithful, "fidelity": fidelity, "wall_s": wall_s,
    }


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tf = [r["teacher_forced"] for r in rows if r.get("teacher_forced", {}).get("positions")]
    return {
        "prompts": len(rows), "failed": sum(1 for r in rows if r["error"]),
        "tokens_equal": sum(1 for r in rows if r["tokens_equal"]),
        "token_agreement": _mean([r["token_agreement"] for r in rows if r["token_agreement"] is not None]),
        "host_ttft_s": _mean([r["host"]["ttft_s"] for r in rows if r["host"]["ttft_s"] is not None]),
        "host_tpot_s": _mean([r["host"]["tpot_s"] for r in rows if r["host"]["tpot_s"] is not None]),
        "link_handoff_s": _mean([r["link"]["handoff_s"] for r in rows if r["link"]["handoff_s"] is not None]),
        "model_handoff_s": _mean([r["model"]["handoff_s"] for r in rows if r["model"]["handoff_s"] is not None]),
        "model_ttft_s": _mean([r["model"]["ttft_s"] for r in rows if r["model"]["ttft_s"] is not None]),
        "model_tpot_s": _mean([r["model"]["tpot_s"] for r in rows]),
        "wire_per_raw": _mean([r["link"]["wire_bytes"] / r["link"]["raw_bytes"] for r in rows
                               if r["link"]["wire_bytes"] and r["link"]["raw_bytes"]]),
        "top1_agree": _mean([t["top1_agree"] for t in tf]),
        "kl_nats_per_token": _mean([t["kl_nats_per_token"] for t in tf]),
    }


def _corrupt(measured: Measured, records: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any] | None:
    row = measured.corrupt
    if row is None:
        return None
    got = records.get(("decode", row["wire_id"]), {})
    return {"prompt": row["prompt"], "decode_error": row["decode"]["error"],
            "decode_tokens": len(row["decode"]["token_ids"]), "kv_outcome": got.get("outcome"),
            "failed_as_it_should": bool(row["decode"]["error"]) and not row["decode"]["token_ids"]
            and str(got.get("outcome", "")).startswith("failed")}


def _f(value: float | None, scale: float = MS, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    s = report["scenario"]
    lines = [f"# vLLM through the middlebox: {report['engine']['vllm']} on this host, link {s['link']}",
             "",
             (f"Model SmolLM2-135M ({report['engine']['dtype']}, {report['engine']['model_dir']}); scale 1 (the real "
             f"KV, full size), dilation {s['dilation']:g}; faithful: {'yes' if report['faithful'] else 'no'}."),
             "",
             report["host_note"] + ".",
             "",
             ("| kernel | prompts equal to single instance | token agreement | top-1 (teacher-forced) | "
              "KL nats/token | wire/raw | TTFT host ms | TPOT host ms | hand-off link ms | hand-off model ms | "
              "TTFT model ms | TPOT model ms |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kernel, block in report["kernels"].items():
        m = block["summary"]
        top1 = "-" if m["top1_agree"] is None else f"{m['top1_agree']:.1%}"
        kl = "-" if m["kl_nats_per_token"] is None else f"{m['kl_nats_per_token']:.3g}"
        agree = "-" if m["token_agreement"] is None else f"{m['token_agreement']:.1%}"
        ratio = "-" if m["wire_per_raw"] is None else f"{m['wire_per_raw']:.3f}"
        lines.append(f"| {kernel} | {m['tokens_equal']}/{m['prompts']} | {agree} | {top1} | {kl} | {ratio} | "
                     f"{_f(m['host_ttft_s'])} | {_f(m['host_tpot_s'])} | {_f(m['link_handoff_s'], digits=3)} | "
                     f"{_f(m['model_handoff_s'], digits=3)} | {_f(m['model_ttft_s'], digits=3)} | "
                     f"{_f(m['model_tpot_s'], digits=3)} |")
    lines += ["", "## The text", ""]
    for i, ref in enumerate(report["reference"]):
        lines.append(f"**{ref['prompt']}** ({ref['prompt_tokens']} prompt tokens)")
        lines.append("")
        lines.append(f"- single instance: {ref['text']!r}")
        for kernel, block in report["kernels"].items():
            row = block["prompts"][i]
            lines.append(f"- {kernel} on the link: {row['text']!r}"
                         + ("" if row["tokens_equal"] else f" (first differs at token {row['first_divergence']})"))
        lines.append("")
    corrupt = report.get("corrupt")
    if corrupt:
        lines += ["## A corrupted block", "",
                  (f"With the middlebox's corrupt fault on, prompt {corrupt['prompt']}: decode answered "
                  f"{corrupt['decode_error']!r} after {corrupt['decode_tokens']} tokens; its KV: "
                  f"{corrupt['kv_outcome']}."), ""]
    lines += ["## Fidelity", ""] + [f"- {name}: {'ok' if g['ok'] else 'FAILED'} ({g['hint']})"
                                    for name, g in report["fidelity"].items()]
    return "\n".join(lines) + "\n"
