"""Remote KV with query-aware selection inside `kvtransit up`, measured beside the model, one
configuration after another in one session.

    python benchmarks/remote_kv_live.py [--requests 8] [--output 16] [--context 32768]

The issue's target: TPOT at a 32k-token remote context over eth-100g with and without selection, and the bytes a
step moves at each page budget. llama3-8b on h100, the decode link eth-100g (the auto scale, 1/256), loopback links
(remote KV's legs share the decode link on the middlebox's user-space bucket), codec none on the hand-off, fixed
2,048-token prompts and `--output` tokens, requests 2 s apart, every request in the long-context class (share 1), so a
step carries one or two remote contexts. For `--select all` (every token a step) and top-k at 1/4, 1/8 and 1/16 of
the mean-key pages, one `Launcher` run each; printed from the report's `remote_kv` block: per request-step the bytes
that crossed (summaries + pages, model bytes) and their reduction against every token, measured and modelled; a
step's legs measured vs the model at the bytes moved; the long class's TPOT p50; and the run's `faithful`. Then a
mixed run: half the requests remote beside ordinary ones (top-k 1/16), with each class's TPOT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from kvtransit.flows.selection.section import SelectionSection
from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.scenario import Scenario

LIGHT = dict(model="llama3-8b", link="eth-100g", kv_pool="pool", kv_placement="remote", rate=0.5,
             arrival="poisson", prompt_mean=2048, prompt_cv=0.0, output_cv=0.0, codec="none")


def run_one(**fields) -> dict:
    scenario = Scenario.build(**fields)
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        launcher = Launcher(scenario, report_path=report_path, accuracy_sample=0, links="loopback",
                            log=lambda _msg: None)
        asyncio.run(launcher.run())
        report = json.loads(report_path.read_text())
    block = report["remote_kv"]
    moved = block["summary_bytes"]["measured"] + block["page_bytes"]["measured"]
    modelled = block["summary_bytes"]["model"] + block["page_bytes"]["model"]
    every = SelectionSection.of(scenario).selection_step(scenario).all_kv_bytes
    tpot = block["tpot_ms"]
    return {"scale": scenario.effective_scale, "dilation": scenario.effective_dilation, "steps": block["steps"],
            "idle_steps": block["idle_link_steps"], "moved_mb": moved / 1e6, "model_mb": modelled / 1e6,
            "reduction": every / moved, "model_reduction": every / modelled,
            "legs_ms": block["legs_s"]["measured"] * 1e3, "model_legs_ms": block["legs_s"]["model"] * 1e3,
            "legs_ratio_median": block["legs_ratio_median"], "legs_ratio_p99": block["legs_ratio_p99"],
            "tpot_remote_ms": tpot["remote"]["p50"] if tpot["remote"] else None,
            "tpot_local_ms": tpot["local"]["p50"] if tpot["local"] else None,
            "failed": report["requests"]["failed"], "faithful": report["faithful"],
            "why": "; ".join(f"{k}: {v['hint']}" for k, v in report["fidelity"].items() if not v["ok"])}


def configurations(requests: int, output: int, context: int):
    common = dict(LIGHT, requests=requests, output_mean=output, remote_context=context)
    yield "all", dict(common, select="all", remote_share=1.0)
    for budget in (1 / 4, 1 / 8, 1 / 16):
        yield f"top-k 1/{round(1 / budget)}", dict(common, select="top-k", select_budget=budget, remote_share=1.0)
    yield "mixed: top-k 1/16, half remote", dict(common, select="top-k", select_budget=1 / 16, remote_share=0.5,
                                                 requests=2 * requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--output", type=int, default=16)
    parser.add_argument("--context", type=int, default=32768)
    args = parser.parse_args(argv)
    print("| select | scale | dilation | steps (idle link) | MB a request-step: measured / model | fewer bytes than "
          "every token: measured / model | a step's legs ms: measured / model | legs median, p99 (idle link) | "
          "TPOT p50 ms: remote / local | failed | faithful |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, fields in configurations(args.requests, args.output, args.context):
        r = run_one(**fields)
        local = "-" if r["tpot_local_ms"] is None else f"{r['tpot_local_ms']:.1f}"
        faithful = "yes" if r["faithful"] else f"NO ({r['why']})"
        print(f"| {name} | 1/{round(1 / r['scale'])} | {r['dilation']:g} | {r['steps']} ({r['idle_steps']}) | "
              f"{r['moved_mb']:.1f} / {r['model_mb']:.1f} | {r['reduction']:.2f}x / {r['model_reduction']:.2f}x | "
              f"{r['legs_ms']:.1f} / {r['model_legs_ms']:.1f} | {r['legs_ratio_median']:.3f}, "
              f"{r['legs_ratio_p99']:.2f} | {r['tpot_remote_ms']:.1f} / {local} | {r['failed']} | {faithful} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
