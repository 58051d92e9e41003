"""`kvtransit cost --tp N | --ep N`: a step split into the group's roofline compute and its collectives over the
scale-up link, not overlapped (docs/reference.md §7): 2·L all-reduces (TP), or L all-reduces and L dispatch + combine
all-to-alls (EP). The core's cost command reaches it through the registry (flows/tp/cli.py: COST_SPLIT)."""

from __future__ import annotations

import argparse
from typing import Any

from kvtransit.cli._common import CliError, print_table

MS = 1e3


def add_flags(parser: argparse.ArgumentParser) -> None:
    par = parser.add_mutually_exclusive_group()
    par.add_argument("--tp", type=int, default=None, metavar="N",
                     help="tensor-parallel group of N GPUs: the step split into compute and all-reduces")
    par.add_argument("--ep", type=int, default=None, metavar="N",
                     help="expert-parallel group (EP = TP = N, a mixture-of-experts model): compute, all-reduces, "
                          "all-to-alls")
    parser.add_argument("--link", default="nvlink4", metavar="LINK",
                   help="the group's scale-up link (default nvlink4; nvlink3, nvlink5, or any catalogued link)")
    parser.add_argument("--allreduce", choices=("ring", "switch"), default="ring",
                   help="ring over the link, or summed in the network by a switch (default ring)")
    parser.add_argument("--module-budget", choices=("low", "sim", "high"), default="sim",
                   help="with --allreduce switch: the switch's ops per line byte (docs/reference.md §5; default sim "
                        "1.6)")
    parser.add_argument("--expert-imbalance", type=float, default=1.0, metavar="X",
                   help="the busiest rank's expert FLOPs over the mean, with --ep (default 1.0)")
    parser.add_argument("--dispatch", choices=("bf16", "fp8"), default="bf16",
                   help="with --ep: the all-to-all's dispatch in BF16, or FP8 cast at the GPU (default bf16)")


def gpus(args: argparse.Namespace) -> int:
    """The GPUs the roofline runs on: the group's, when --tp or --ep names one (--gpus must agree)."""
    group = args.tp or args.ep
    if group is None:
        return int(args.gpus)
    if args.gpus not in (1, group):
        raise CliError(f"--gpus {args.gpus} disagrees with the group of {group}: give one of them")
    return int(group)


def split_rows(args: argparse.Namespace, model: Any, device: Any) -> list[dict[str, Any]]:
    """Each step split into compute and collectives on the TP/EP group (flows/tp/model.py); [] without a group."""
    if (args.tp or args.ep) is None:
        return []
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


def show_split(split: list[dict[str, Any]]) -> None:
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
        caption="step = compute on the group (roofline, docs/reference.md §3) + collectives, not overlapped "
                "(docs/reference.md §7)"
                + ("; FP8 dispatch: + the GPU's casts " + ", ".join(f"{r['step']} {r['cast_s'] * MS:,.3f} ms"
                                                                    for r in split)
                   if first["dispatch"] == "fp8" else ""),
    )
