"""`kvtransit cost`: GPU step times from the roofline model (REFERENCE §3).

    kvtransit cost --model llama3-8b --device h100 --gpus 1 --prefill 2048
    kvtransit cost --model llama3-70b --device h100 --gpus 4 --decode-batch 16 --context 2300
    kvtransit cost --model llama3-70b --tp 4 --link nvlink4 --allreduce ring --decode-batch 1 --context 2048
    kvtransit cost --model mixtral-8x7b --ep 2 --prefill 2048,2048,2048,2048

With --tp N (or --ep N for a mixture of experts: EP = TP = N) the step is split (REFERENCE §7): roofline compute
on N GPUs, then the collectives over the scale-up link, not overlapped: 2·L all-reduces (TP), or L all-reduces
and L dispatch + combine all-to-alls (EP).
"""

from __future__ import annotations

import argparse
from typing import Any

from kvtransit.cli._common import CliError, add_json_flag, print_json, print_table
from kvtransit.cli._model_args import add_model_flags, model_from_args

MS = 1e3


def _prompt_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"prompt lengths must be positive integers, got {text!r}")
    return values


def register(subparsers) -> None:
    from kvtransit.model.catalog.devices import DEVICES

    p = subparsers.add_parser("cost", help="GPU prefill and decode step times (roofline)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p)
    p.add_argument("--device", choices=sorted(DEVICES), default="h100", help="GPU (default h100)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs the model is split across (default 1)")
    p.add_argument("--prefill", type=_prompt_list, default=None, metavar="N[,N...]",
                   help="prompt lengths batched into one prefill step")
    p.add_argument("--decode-batch", type=int, default=None, metavar="B", help="sequences in one decode step")
    ctx = p.add_mutually_exclusive_group()
    ctx.add_argument("--context", type=int, default=None, metavar="C",
                     help="context tokens of EACH decoding sequence (prompt + tokens so far)")
    ctx.add_argument("--context-total", type=int, default=None, metavar="C",
                     help="context tokens summed over the decode batch")
    par = p.add_mutually_exclusive_group()
    par.add_argument("--tp", type=int, default=None, metavar="N",
                     help="tensor-parallel group of N GPUs: the step split into compute and all-reduces")
    par.add_argument("--ep", type=int, default=None, metavar="N",
                     help="expert-parallel group (EP = TP = N, a mixture-of-experts model): compute, all-reduces, "
                          "all-to-alls")
    p.add_argument("--link", default="nvlink4", metavar="LINK",
                   help="the group's scale-up link (default nvlink4; nvlink3, nvlink5, or any catalogued link)")
    p.add_argument("--allreduce", choices=("ring", "switch"), default="ring",
                   help="ring over the link, or summed in the network by a switch (default ring)")
    p.add_argument("--module-budget", choices=("low", "sim", "high"), default="sim",
                   help="with --allreduce switch: the switch's ops per line byte (REFERENCE §5; default sim 1.6)")
    p.add_argument("--expert-imbalance", type=float, default=1.0, metavar="X",
                   help="the busiest rank's expert FLOPs over the mean, with --ep (default 1.0)")
    p.add_argument("--dispatch", choices=("bf16", "fp8"), default="bf16",
                   help="with --ep: the all-to-all's dispatch in BF16, or FP8 cast at the GPU (default bf16)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.cost.roofline import decode_work, kv_capacity_tokens, prefill_work, step_energy_j, step_time

    if args.prefill is None and args.decode_batch is None:
        raise CliError("give --prefill N[,N...] and/or --decode-batch B with --context C")
    if args.decode_batch is None and (args.context is not None or args.context_total is not None):
        raise CliError("--context needs --decode-batch")
    if args.decode_batch is not None and args.context is None and args.context_total is None:
        raise CliError("--decode-batch needs --context C (each) or --context-total C")
    if (args.context is not None and args.context < 0) or (args.context_total is not None and args.context_total < 0):
        raise CliError("context tokens must be >= 0")

    model = model_from_args(args)
    device = device_by_name(args.device)
    group = args.tp or args.ep
    if group is not None and args.gpus not in (1, group):
        raise CliError(f"--gpus {args.gpus} disagrees with the group of {group}: give one of them")
    if group is not None:
        args.gpus = group
    steps = []
    if args.prefill is not None:
        steps.append(("prefill", f"prompts {','.join(map(str, args.prefill))}", prefill_work(model, args.prefill)))
    if args.decode_batch is not None:
        total = args.context_total if args.context_total is not None else args.context * args.decode_batch
        steps.append(("decode", f"batch {args.decode_batch}, context {total:,} total",
                      decode_work(model, args.decode_batch, total)))

    records: list[dict[str, Any]] = []
    for kind, what, work in steps:
        timing = step_time(work, device, args.gpus)
        records.append({
            "step": kind, "what": what, "flops": work.flops, "hbm_bytes": work.hbm_bytes,
            "compute_s": timing.compute_s, "memory_s": timing.memory_s, "step_s": timing.total_s,
            "bound": timing.bound, "energy_j": step_energy_j(device, work),
        })
    capacity = kv_capacity_tokens(model, device, args.gpus)
    split = _parallel_split(args, model, device) if group is not None else []
    if args.json:
        data: dict[str, Any] = {"model": model.name, "device": device.name, "gpus": args.gpus,
                                "kv_capacity_tokens": capacity, "steps": records}
        if split:
            data["parallel"] = split
        print_json(data)
        return 0
    print_table(
        f"{model.name} on {args.gpus}×{device.name}",
        ["Step", "Batch", "TFLOP", "HBM (GB)", "Compute (ms)", "Memory (ms)", "Step (ms)", "Bound", "Energy (J)"],
        [
            [r["step"], r["what"], f"{r['flops'] / 1e12:,.3f}", f"{r['hbm_bytes'] / 1e9:,.3f}",
             f"{r['compute_s'] * MS:,.3f}", f"{r['memory_s'] * MS:,.3f}", f"{r['step_s'] * MS:,.3f}", r["bound"],
             f"{r['energy_j']:,.2f}"]
            for r in records
        ],
        caption=f"step = max(compute, memory) + 0.5 ms; KV capacity {capacity:,} tokens",
    )
    if split:
        _print_split(split)
    return 0


def _parallel_split(args: argparse.Namespace, model, device) -> list[dict[str, Any]]:
    """Each step split into compute and collectives on the TP/EP group (flows/tp/model.py)."""
    from kvtransit.flows.tp.model import check_ep, check_tp, tp_decode_step, tp_prefill_step
    from kvtransit.model.catalog.links import link_by_name

    link = link_by_name(args.link)
    if args.ep is not None:
        check_ep(model, args.ep)
    else:
        check_tp(model, args.tp)
    from kvtransit.flows.tp.moe_dispatch import place_dispatch
    from kvtransit.model.module.budget import MODULE_BUDGETS, Module

    common = {"tp": args.tp or 1, "ep": args.ep or 0, "allreduce": args.allreduce,
              "expert_imbalance": args.expert_imbalance,
              "module": Module(ops_per_byte=MODULE_BUDGETS[args.module_budget]),
              "dispatch": place_dispatch(args.dispatch)}
    steps = []
    if args.prefill is not None:
        steps.append(("prefill", tp_prefill_step(model, device, link, args.prefill, **common)))
    if args.decode_batch is not None:
        total = args.context_total if args.context_total is not None else args.context * args.decode_batch
        steps.append(("decode", tp_decode_step(model, device, link, batch=args.decode_batch, context_total=total,
                                               **common)))
    return [{
        "step": kind, "group": step.n, "parallelism": "ep" if args.ep else "tp", "link": link.name,
        "allreduce": step.allreduce_kind, "compute_s": step.compute_s,
        "allreduces": step.allreduces, "allreduce_bytes": step.allreduce_bytes, "allreduce_s": step.allreduce_s,
        "alltoalls": step.alltoalls, "alltoall_bytes": step.alltoall_bytes, "alltoall_s": step.alltoall_s,
        "dispatch": step.dispatch.codec, "cast_s": step.cast_s, "step_s": step.total_s,
        "compute_share": step.share(step.compute_s),
        "allreduce_share": step.share(step.allreduce_s), "alltoall_share": step.share(step.alltoall_s),
    } for kind, step in steps]


def _print_split(split: list[dict[str, Any]]) -> None:
    first = split[0]
    print_table(
        f"{first['parallelism'].upper()}{first['group']} over {first['link']}, all-reduce {first['allreduce']}",
        ["Step", "Compute (ms)", "All-reduce (ms)", "All-to-all (ms)", "Step (ms)", "Compute %", "All-reduce %",
         "All-to-all %"],
        [
            [r["step"], f"{r['compute_s'] * MS:,.3f}",
             f"{r['allreduce_s'] * MS:,.3f} ({r['allreduces']}×)",
             f"{r['alltoall_s'] * MS:,.3f} ({r['alltoalls']}×)" if r["alltoalls"] else "-",
             f"{r['step_s'] * MS:,.3f}", f"{r['compute_share']:.1%}", f"{r['allreduce_share']:.1%}",
             f"{r['alltoall_share']:.1%}" if r["alltoalls"] else "-"]
            for r in split
        ],
        caption="step = compute on the group (roofline, REFERENCE §3) + collectives, not overlapped (REFERENCE §7)"
                + ("; FP8 dispatch: + the GPU's casts " + ", ".join(f"{r['step']} {r['cast_s'] * MS:,.3f} ms"
                                                                    for r in split)
                   if first["dispatch"] == "fp8" else ""),
    )
