"""`kvtransit calc`: what one KV hand-off costs on each link (docs/reference.md §1, §2, §5).

With no selection it prints docs/reference.md §2's hand-off table (llama3-8b/70b × 2,048/32,768 tokens × four
links). With a model, prompt, link or codec it prints, per link: hand-off and wire bytes, transfer time,
hand-offs per second to fill the link, and energy on the link and in the module; and the weight-load time.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvtransit.cli._common import add_json_flag, module_budget_arg, print_json, print_table
from kvtransit.cli._model_args import add_model_flags, model_from_args

MB = 1e6
MS = 1e3


def register(subparsers) -> None:
    from kvtransit.model.catalog.codecs import CODEC_NAMES, DEFAULT_FP4_BLOCK, DEFAULT_KEEP
    from kvtransit.model.catalog.links import LINKS
    from kvtransit.model.module.budget import Policy

    p = subparsers.add_parser("calc", help="hand-off size, transfer time and energy per link",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p)
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens handed off (default 2048)")
    p.add_argument("--link", action="append", choices=sorted(LINKS), default=None,
                   help="a link (repeat for several; default nvlink4, ib-ndr, eth-100g, eth-25g)")
    p.add_argument("--codec", choices=CODEC_NAMES, default=None, help="codec on the hand-off (default none)")
    p.add_argument("--keep", type=float, default=None, help=f"freq-keep-k: fraction kept (default {DEFAULT_KEEP})")
    p.add_argument("--block", type=int, default=None, help=f"fp4-block: values per scale (default {DEFAULT_FP4_BLOCK})")
    p.add_argument("--module-budget", "--budget", dest="budget", type=module_budget_arg, default="sim",
                   metavar="low|sim|high|OPS",
                   help="module ops per line byte: low 0.40, sim 1.6 (default), high 3.96, or a number > 0 (--budget: "
                        "the old spelling, for one release)")
    p.add_argument("--policy", choices=[x.value for x in Policy], default=Policy.HOST.value,
                   help="a codec needing an unpublished op: run it on the host (default) or reject it")
    add_json_flag(p)
    p.set_defaults(func=run)


def _selection_given(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.model, args.model_shape, args.prompt, args.link, args.codec,
                                       args.keep, args.block))


def run(args: argparse.Namespace) -> int:
    if _selection_given(args):
        return _run_custom(args)
    return _run_reference_table(args)


def _run_reference_table(args: argparse.Namespace) -> int:
    from kvtransit.model.catalog.links import link_by_name
    from kvtransit.model.catalog.models import model_by_name
    from kvtransit.model.cost.handoff import HANDOFF_TABLE_LINKS, HANDOFF_TABLE_MODELS, HANDOFF_TABLE_PROMPTS, handoff

    links = [link_by_name(name) for name in HANDOFF_TABLE_LINKS]
    records: list[dict[str, Any]] = []
    for model_name in HANDOFF_TABLE_MODELS:
        model = model_by_name(model_name)
        for prompt in HANDOFF_TABLE_PROMPTS:
            estimates = [handoff(model, prompt, link) for link in links]
            records.append({
                "model": model.name,
                "prompt_tokens": prompt,
                "handoff_bytes": estimates[0].kv_bytes,
                "transfer_s": {e.link: e.transfer_s for e in estimates},
            })
    if args.json:
        print_json({"links": list(HANDOFF_TABLE_LINKS), "rows": records})
        return 0
    print_table(
        "KV hand-off per link (docs/reference.md §2)",
        ["Model", "Prompt", "Hand-off (MB)", *(f"{name} (ms)" for name in HANDOFF_TABLE_LINKS)],
        [
            [r["model"], f"{r['prompt_tokens']:,}", f"{r['handoff_bytes'] / MB:,.1f}",
             *(f"{r['transfer_s'][name] * MS:,.2f}" for name in HANDOFF_TABLE_LINKS)]
            for r in records
        ],
        caption="transfer = latency + bytes / bandwidth; MB = 1e6 bytes",
    )
    return 0


def _run_custom(args: argparse.Namespace) -> int:
    from kvtransit.model.catalog.codecs import DEFAULT_FP4_BLOCK, DEFAULT_KEEP, codec_declaration
    from kvtransit.model.catalog.links import link_by_name
    from kvtransit.model.cost.handoff import HANDOFF_TABLE_LINKS, handoff, weight_load_s
    from kvtransit.model.errors import require_positive
    from kvtransit.model.module.budget import Module, Policy, budget_ops_per_byte

    model = model_from_args(args)
    prompt = args.prompt if args.prompt is not None else 2048
    require_positive("--prompt", prompt)
    codec = codec_declaration(args.codec or "none",
                              keep=args.keep if args.keep is not None else DEFAULT_KEEP,
                              block=args.block if args.block is not None else DEFAULT_FP4_BLOCK)
    module = Module(ops_per_byte=budget_ops_per_byte(args.budget))
    links = [link_by_name(name) for name in (args.link or HANDOFF_TABLE_LINKS)]
    estimates = [handoff(model, prompt, link, codec, module, Policy(args.policy)) for link in links]
    load_s = weight_load_s(model)
    verdict = estimates[0].budget.describe() if estimates[0].budget else "no codec: bare link"

    if args.json:
        print_json({
            "model": model.name,
            "prompt_tokens": prompt,
            "codec": codec.name,
            "codec_ratio": codec.ratio,
            "module_budget_ops_per_byte": module.ops_per_byte,
            "verdict": verdict,
            "weight_bytes": model.resident_weight_bytes,
            "weight_load_s": load_s,
            "links": [
                {
                    "link": e.link, "placement": e.placement, "kv_bytes": e.kv_bytes, "wire_bytes": e.wire_bytes,
                    "transfer_s": e.transfer_s, "occupancy_s": e.occupancy_s,
                    "handoffs_per_s_to_fill": e.handoffs_per_s_to_fill, "link_energy_j": e.link_energy_j,
                    "module_energy_j": e.module_energy_j, "transit_bound": e.transit_bound,
                }
                for e in estimates
            ],
        })
        return 0
    print_table(
        f"{model.name}, {prompt:,}-token hand-off, codec {codec.name} (ratio {codec.ratio:.3f})",
        ["Link", "Hand-off (MB)", "Wire (MB)", "Transfer (ms)", "Hand-offs/s to fill", "Link (mJ)",
         "Module (mJ)", "Codec runs", "Bound"],
        [
            [e.link, f"{e.kv_bytes / MB:,.1f}", f"{e.wire_bytes / MB:,.1f}", f"{e.transfer_s * MS:,.2f}",
             f"{e.handoffs_per_s_to_fill:,.1f}", f"{e.link_energy_j * MS:,.2f}", f"{e.module_energy_j * MS:,.2f}",
             e.placement, "transit" if e.transit_bound else "wire"]
            for e in estimates
        ],
        caption=(f"module: {verdict}. Weights {model.resident_weight_bytes / 1e9:,.2f} GB load over PCIe Gen5 x16 "
                 f"in {load_s:,.2f} s"),
    )
    return 0
