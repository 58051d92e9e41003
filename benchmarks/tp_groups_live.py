"""TP groups inside `kvtransit up`, measured beside the model, one configuration after another in
one session.

    python benchmarks/tp_groups_live.py [--requests 3] [--output 128]

Light load as the issue's target has it, on loopback links, the hand-off over eth-25g:
- decode TP groups: llama3-70b on h100 (2 GPUs a prefill), the decode a TP group of 4 or 8, ring or switch, over
  nvlink4, fixed 2,048-token prompts and `--output` tokens, requests 2 s apart (one decoding at a time: b = 1,
  context ~2,048), at the auto scale and dilations 1 and 2;
- a decode EP group: mixtral-8x7b (2 GPUs a prefill), the decode EP = TP = 2 (an all-reduce and a ring all-to-all
  a step), at dilations 1 and 4;
- a prefill TP group: llama3-8b, the prefill TP 2 and 4, ring, 1,024-token prompts, at scale 1/64 and 1/256 and
  dilation 10 (a prefill step's all-reduces carry every prompt token's activations).
For each, one `Launcher` run; printed: the model's mean step and collective share, the measured ones (the report's
`collectives` block: step end to step end, and compute held → step end, as the step ran; the mean step telescopes,
steps being on absolute deadlines, so the p99 of each step's measured / modelled time is beside it), the points
between the shares, the steps whose real collectives outlasted them, and the run's `faithful`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.scenario import Scenario

LIGHT = dict(rate=0.5, arrival="poisson", prompt_mean=2048, prompt_cv=0.0, output_cv=0.0, codec="none")


def run_one(role: str, **fields) -> dict:
    scenario = Scenario.build(**fields)
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        launcher = Launcher(scenario, report_path=report_path, accuracy_sample=0, log=lambda _msg: None)
        asyncio.run(launcher.run())
        report = json.loads(report_path.read_text())
    block = report["collectives"][role]
    return {"scale": scenario.effective_scale, "dilation": scenario.effective_dilation,
            "model_step_ms": block["step_s"]["model"] * 1e3, "measured_step_ms": block["step_s"]["measured"] * 1e3,
            "model_share": block["collective_share"]["model"], "measured_share": block["collective_share"]["measured"],
            "steps": block["steps"], "overrun_steps": block["overrun_steps"], "sums_checked": block["sums_checked"],
            "step_ratio_p99": block["step_ratio_p99"],
            "faithful": report["faithful"]}


def configurations(requests: int, output: int):
    for dilation in (1.0, 2.0):
        for tp in (4, 8):
            for allreduce in ("ring", "switch"):
                yield (f"decode TP{tp} llama3-70b", allreduce, "decode",
                       dict(LIGHT, model="llama3-70b", gpus=2, decode_tp=tp, allreduce=allreduce, dilation=dilation,
                            requests=requests, output_mean=output))
    for dilation in (1.0, 4.0):
        yield ("decode EP2 mixtral-8x7b", "ring + all-to-all", "decode",
               dict(LIGHT, model="mixtral-8x7b", gpus=2, decode_tp=2, decode_ep=True, dilation=dilation,
                    requests=requests, output_mean=output))
    for tp in (2, 4):
        for scale in (1 / 64, 1 / 256):
            yield (f"prefill TP{tp} llama3-8b", "ring", "prefill",
                   dict(LIGHT, prefill_tp=tp, scale=scale, dilation=10.0, prompt_mean=1024, rate=2.0,
                        requests=4 * requests, output_mean=16))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--output", type=int, default=128)
    args = parser.parse_args()
    print("| group | collectives | scale / dilation | model step | measured | step p99 / model | model share | "
          "measured | points | overrun steps | sums exact | faithful |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, collectives, role, fields in configurations(args.requests, args.output):
        r = run_one(role, **fields)
        print(f"| {name} | {collectives} | 1/{1 / r['scale']:.0f} / {r['dilation']:g} | {r['model_step_ms']:.3f} ms | "
              f"{r['measured_step_ms']:.3f} ms | {r['step_ratio_p99']:.3f} | {r['model_share']:.1%} | "
              f"{r['measured_share']:.1%} | "
              f"{(r['measured_share'] - r['model_share']) * 100:+.2f} | {r['overrun_steps']} of {r['steps']} | "
              f"{r['sums_checked']} | {'yes' if r['faithful'] else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
