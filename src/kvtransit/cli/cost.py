"""`kvtransit cost`: GPU step times from the roofline model (docs/reference.md §3).

    kvtransit cost --model llama3-8b --device h100 --gpus 1 --prefill-prompts 2048
    kvtransit cost --model llama3-70b --device h100 --gpus 4 --decode-batch 16 --context 2300
    kvtransit cost --model llama3-70b --tp 4 --link nvlink4 --allreduce ring --decode-batch 1 --context 2048
    kvtransit cost --model mixtral-8x7b --ep 2 --prefill-prompts 2048,2048,2048,2048

With --tp N (or --ep N for a mixture of experts: EP = TP = N) the step is split (docs/reference.md §7): roofline compute
on N GPUs, then the collectives over the scale-up link, not overlapped: 2·L all-reduces (TP), or L all-reduces
and L dispatch + combine all-to-alls (EP). That split is the tp flow's (flows/tp/cost_split.py), which adds its
flags here through the registry.
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
    p.add_argument("--prefill-prompts", "--prefill", dest="prefill", type=_prompt_list, default=None,
                   metavar="N[,N...]", help="prompt lengths batched into one prefill step (--prefill: the old "
                                            "spelling, for one release)")
    p.add_argument("--decode-batch", type=int, default=None, metavar="B", help="sequences in one decode step")
    ctx = p.add_mutually_exclusive_group()
    ctx.add_argument("--context", type=int, default=None, metavar="C",
                     help="context tokens of EACH decoding sequence (prompt + tokens so far)")
    ctx.add_argument("--context-total", type=int, default=None, metavar="C",
                     help="context tokens summed over the decode batch")
    for add in _cost_splits("add_flags"):  # a flow's own split of the step (the tp flow: --tp, --ep, ...)
        add(p)
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
    for gpus in _cost_splits("gpus"):  # a flow's group sets the GPUs the roofline runs on
        args.gpus = gpus(args)
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
    splits = [(key, rows, show) for split, key, show in zip(_cost_splits("rows"), _cost_splits("key"),
                                                              _cost_splits("show"), strict=True)
              if (rows := split(args, model, device))]
    if args.json:
        data: dict[str, Any] = {"model": model.name, "device": device.name, "gpus": args.gpus,
                                "kv_capacity_tokens": capacity, "steps": records}
        data.update({key: rows for key, rows, _ in splits})
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
    for _key, rows, show in splits:
        show(rows)
    return 0


def _cost_splits(face: str) -> list[Any]:
    """Each flow's split of a step beside the roofline's (a flow's cli.py: COST_SPLIT, a mapping of `add_flags`,
    `gpus`, `rows`, `key`, `show`), reached through the registry."""
    from kvtransit import flows

    return [split[face] for _, split in flows.attribute("cli", "COST_SPLIT")]
