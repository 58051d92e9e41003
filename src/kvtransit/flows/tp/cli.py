"""`kvtransit collective`: a TP group's decode steps with real all-reduces over sockets, measured beside the model.

    kvtransit collective --model llama3-70b --device h100 --tp 4 --allreduce ring --scaleup-link nvlink4 \\
        --tokens 1 --context 2048 --steps 5 --scale 0.01 --dilation 10
    kvtransit collective --model mixtral-8x7b --ep 2 --prefill-prompts 2048,2048,2048,2048 --scale 0.001 --dilation 2

With --ep N (a mixture of experts, EP = TP = N) each layer has one all-reduce (attention) and a dispatch +
combine all-to-all (the MLP), both between the ranks of a ring; --prefill-prompts makes the step a prefill of those
prompts instead of a decode step. --dispatch fp8 sends the dispatch through the fp8 kernel (the combine stays
BF16): it needs rounding, so it runs at the GPU (--dispatch-at gpu, the default), and in transit the module
refuses it (--policy reject) or the policy moves it to the GPU (--policy host). Its error is measured on the real
model's MLP inputs when the realkv extra is installed (--no-dispatch-accuracy skips it), else marked not measured.

    kvtransit collective --model mixtral-8x7b --ep 2 --prefill-prompts 2048,2048,2048,2048 --dispatch fp8 \\
        --scale 0.001 --dilation 2

n rank processes (one OS process each; + a switch process with --allreduce switch) hold their shard's
roofline compute, then all-reduce real bytes: a ring between neighbours, or through a switch that sums the n
streams. Every rank checks every sum against the exact sum. Printed: the measured decode step and all-reduce
share next to the model's (docs/reference.md §7), the scale, the dilation and the granularity (per layer, or per step
with the per-layer latency held by the model when the host cannot carry per-layer messages at that dilation). The flags
it shares with `kvtransit up` are spelled as there (docs/flags.md).
"""

from __future__ import annotations

import argparse
import math

from kvtransit.cli._common import add_json_flag, print_json, print_table
from kvtransit.cli.cost import _prompt_list
from kvtransit.flows.tp import cost_split
from kvtransit.flows.tp.switch import cli as switch_cli

MS = 1e3


def register(subparsers) -> None:
    from kvtransit.cli.scenario_flags import add_scenario_flag
    from kvtransit.model.catalog.devices import DEVICES

    p = subparsers.add_parser("collective", help="TP all-reduce as real bytes over sockets (ring or switch)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from kvtransit.cli._model_args import add_model_flags

    add_model_flags(p, default="llama3-70b")
    add_scenario_flag(p, "device", aliases=("--gpu",), choices=sorted(DEVICES))
    group = p.add_mutually_exclusive_group()
    group.add_argument("--tp", type=int, default=None, metavar="N", help="ranks in the TP group (default 4)")
    group.add_argument("--ep", type=int, default=None, metavar="N",
                       help="an EP = TP = N group of a mixture-of-experts model (ring only)")
    add_scenario_flag(p, "allreduce", choices=("ring", "switch"), help="between neighbours, or summed by a switch")
    add_scenario_flag(p, "scaleup_link", aliases=("--link",), help="the scale-up link between the ranks")
    p.add_argument("--tokens", type=int, default=1, help="sequences in the decode batch, one token each (default 1)")
    p.add_argument("--context", type=int, default=2048, help="context tokens of each sequence (default 2048)")
    p.add_argument("--prefill-prompts", "--prefill", dest="prefill", type=_prompt_list, default=None,
                   metavar="N[,N...]", help="a prefill step of these prompt lengths instead of a decode step "
                                            "(--prefill: the old spelling, for one release)")
    p.add_argument("--steps", type=int, default=5, help="decode steps (default 5; step 0 is a warm-up)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="activation bytes at this scale, link rate scaled with them (default 1.0)")
    p.add_argument("--dilation", type=float, default=1.0, help="stretch every modelled duration (default 1)")
    add_scenario_flag(p, "module_budget", help="ops per line byte the switch's module affords: low (0.40), sim (1.6), "
                                               "high (3.96) or a number > 0")
    p.add_argument("--granularity", choices=("auto", "layer", "step"), default="auto",
                   help="real all-reduces per layer, or one a step (default auto: what the host can carry)")
    p.add_argument("--dispatch", choices=("bf16", "fp8"), default="bf16",
                   help="what an EP all-to-all's dispatch carries (default bf16; fp8: the fp8 kernel)")
    p.add_argument("--dispatch-at", choices=("gpu", "transit"), default="gpu",
                   help="where the dispatch's fp8 runs: at the GPU (default) or in the link's module")
    add_scenario_flag(p, "policy", choices=("reject", "host"),
                      help="a kernel the module cannot run (fp8 needs rounding): refuse it, or run it at the GPU")
    p.add_argument("--no-dispatch-accuracy", action="store_true",
                   help="skip measuring fp8's error on the real model's MLP inputs (loads the model, ~20 s)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from kvtransit.cli._model_args import model_from_args
    from kvtransit.flows.tp.run import plan_collective, run_collective
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.links import link_by_name
    from kvtransit.model.field_checks import module_budget
    from kvtransit.model.module.budget import Module, Policy, budget_ops_per_byte

    prompts = args.prefill
    tp = args.tp if args.tp is not None else (0 if args.ep else 4)
    module = Module(ops_per_byte=budget_ops_per_byte(module_budget(args.module_budget)))
    plan = plan_collective(model_from_args(args), device_by_name(args.device), link_by_name(args.scaleup_link),
                           tp=tp, ep=args.ep or 0, allreduce=args.allreduce, tokens=args.tokens, context=args.context,
                           prompts=prompts, steps=args.steps, scale=args.scale, dilation=args.dilation,
                           granularity=args.granularity, module=module,
                           dispatch=args.dispatch, dispatch_at=args.dispatch_at, policy=Policy(args.policy))
    report = asyncio.run(run_collective(plan))
    summary = report.summary()
    if args.dispatch == "fp8":
        summary["dispatch_accuracy"] = _dispatch_accuracy(skip=args.no_dispatch_accuracy)
    if args.json:
        print_json(summary)
        return 0 if report.ok else 1

    def ms(value: float) -> str:
        return "-" if math.isnan(value) else f"{value * MS:,.3f}"

    def pct(value: float) -> str:
        return "-" if math.isnan(value) else f"{value:.1%}"

    print_table(
        f"{summary['model']} {summary['parallelism'].upper()}{summary['group']} on {summary['device']}, "
        f"all-reduce {summary['allreduce']} over {summary['link']}",
        ["", f"{summary['step'].capitalize()} step (ms)",
         "Collective share" if summary["parallelism"] == "ep" else "All-reduce share"],
        [["model", ms(summary["model_step_s"]), pct(summary["model_collective_share"])],
         ["measured", ms(summary["measured_step_s"]), pct(summary["measured_collective_share"])],
         ["measured − model", pct(summary["step_error"]),
          "-" if math.isnan(summary["share_error_points"]) else f"{summary['share_error_points']:+.2f} points"]],
        caption=(f"scale {summary['scale']:.4g}, dilation {summary['dilation']:g}, granularity per "
                 f"{summary['granularity']} ({summary['granularity_why']}); {summary['processes']} processes; "
                 f"{summary['sums_checked']} sums checked exact"),
    )
    print(f"faithful: {summary['faithful_line']}")
    if report.switch:
        sw = report.switch
        print(f"switch: {sw['sums']} sums, {sw['input_bytes']:,} B in, {sw['energy_j']:.3g} J (module, model scale), "
              f"kernel {sw['budget']}")
        test = sw.get("placement_test")
        if test:
            verdict = {True: "pass", False: "FAIL", None: "not measured"}[test["passed"]]
            print(f"placement test: {verdict}: streams needed {sw['streams_declared']}, merged per sum "
                  f"{sw['streams_per_sum']} ({test['reason']})")
    if summary.get("dispatch"):
        _print_dispatch(summary)
    for failure in report.failures:
        print(f"FAILED: {failure}")
    return 0 if report.ok else 1


def _dispatch_accuracy(*, skip: bool) -> dict:
    """FP8's error on the real model's MLP inputs (flows/tp/dispatch_accuracy.py), or why it was not measured."""
    from kvtransit.realmodel.extra import INSTALL_HINT, missing_packages

    if skip:
        return {"measured": False, "why": "skipped (--no-dispatch-accuracy)"}
    if missing := missing_packages():
        return {"measured": False, "why": f"the realkv extra is not installed ({', '.join(missing)} missing: "
                                          f"{INSTALL_HINT})"}
    from kvtransit.flows.tp.dispatch_accuracy import fp8_dispatch_error
    from kvtransit.realmodel.session import Session

    return {"measured": True, **fp8_dispatch_error(Session()).to_json()}


def _print_dispatch(summary: dict) -> None:
    d = summary["dispatch"]
    where = {"gpu": "at the GPU", "transit": "in transit", "-": "nowhere"}[d["runs_at"]]
    print(f"dispatch: {d['codec']} {where} ({d['why']}); the model's casts {summary['model_cast_s'] * MS:,.3f} ms "
          f"a step, the all-to-all {summary['model_alltoall_s'] * MS:,.3f} ms")
    acc = summary.get("dispatch_accuracy")
    if acc is None:
        return
    if acc["measured"]:
        print(f"dispatch accuracy: fp8's relative L2 error {acc['relative_l2']:.4f} (worst layer {acc['worst_layer']}: "
              f"{acc['worst_layer_relative_l2']:.4f}; E4M3's rounding bound {acc['bound']:.4f}) on {acc['source']}")
    else:
        print(f"dispatch accuracy: not measured: {acc['why']}")


# `kvtransit cost --tp N | --ep N`: the group's split of a step, added to the core's cost command (cli/cost.py).
COST_SPLIT = {"add_flags": cost_split.add_flags, "gpus": cost_split.gpus, "rows": cost_split.split_rows,
              "key": "parallel", "show": cost_split.show_split}

# `kvtransit middlebox --placement switch --ranks N`: the core's middlebox command adds the switch's flags and, for a
# kernel that combines streams, serves the switch through this (cli/middlebox.py).
STREAM_SUM = {"add_flags": switch_cli.add_switch_flags, "serve": switch_cli.serve_stream_sum}
