"""`kvtransit ring`: ring attention live, n rank processes passing real KV blocks round a shaped ring.

    kvtransit ring --model llama3-8b --ring-ranks 4 --ring-prompt 32768 --ring-link eth-100g
    kvtransit ring --ring-ranks 8 --ring-prompt 65536 --ring-link eth-25g --codec freq-keep-k --keep 0.5 --sinks 4

The flags it shares with `kvtransit up` are spelled as there (docs/flags.md). A prompt of --ring-prompt tokens is
split into n blocks, one a rank (one OS process each). Per layer, every rank
computes blockwise attention on the block it holds (the model's roofline time, held on the clock) while passing
that block to the next rank over the ring link, n − 1 hops a layer; a step lasts whichever is longer (overlap),
as measured. The blocks are the real-KV sample's (SmolLM2-135M, tests/data/smollm2_kv_sample.npz), so a hop's
bytes are a sample block standing for the model's: the scale is their ratio, printed. A codec on the ring's links
(--codec) runs on every hop, on the real blocks, in the module when its policy allows it (docs/reference.md §5), and the
rank holding the sample's decode queries measures the ring's attention-output error against exact attention,
next to the same codec's error measured offline (one pass, n − 1 hops). Printed: the measured prompt and hop next
to the model's (docs/reference.md §7), whether the hop is link- or compute-bound, the scale and the dilation.
"""

from __future__ import annotations

import argparse
import math

from kvtransit.cli._common import CliError, add_json_flag, number_or_auto, print_json, print_table

MS = 1e3


def register(subparsers) -> None:
    from kvtransit.cli._model_args import add_model_flags
    from kvtransit.cli.scenario_flags import add_scenario_flag
    from kvtransit.model.catalog.codecs import CODEC_NAMES
    from kvtransit.model.catalog.devices import DEVICES

    p = subparsers.add_parser("ring", help="ring attention's KV blocks as real bytes round a shaped ring",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p, default="llama3-8b")
    add_scenario_flag(p, "device", aliases=("--gpu",), choices=sorted(DEVICES))
    add_scenario_flag(p, "ring_ranks", aliases=("--n",), help="ranks in the ring (2, 4, 8 split the sample)")
    add_scenario_flag(p, "ring_prompt", aliases=("--context",), help="prompt tokens, a multiple of the ranks")
    add_scenario_flag(p, "ring_link")
    add_scenario_flag(p, "codec", default="none", choices=CODEC_NAMES, help="the kernel on every hop")
    add_scenario_flag(p, "keep")
    add_scenario_flag(p, "sinks")
    add_scenario_flag(p, "precision_bits", aliases=("--bits",),
                      help="freq-keep-k: bits the analogue path delivers (1..32), or none (exact)")
    add_scenario_flag(p, "transform_charged")
    add_scenario_flag(p, "module_budget")
    add_scenario_flag(p, "policy", choices=("reject", "host"),
                      help="a kernel the module cannot run (fp8 needs rounding): refuse it, or run it at the GPUs")
    p.add_argument("--prompts", type=int, default=4, help="prompts one after another (default 4; the first warms up)")
    p.add_argument("--dilation", type=number_or_auto, default="auto",
                   help="stretch every modelled duration (default auto: what this host can carry)")
    p.add_argument("--sample", default=None, help="the real-KV sample (default tests/data/smollm2_kv_sample.npz)")
    p.add_argument("--text", default="prose", help="which of the sample's texts (default prose)")
    p.add_argument("--wire-dtype", choices=("bfloat16", "float16"), default="bfloat16",
                   help="the blocks' dtype on the wire (default bfloat16; the sample is float16, so float16 is "
                        "lossless)")
    add_json_flag(p)
    p.set_defaults(func=run)


def _codec_params(args: argparse.Namespace) -> dict:
    if args.codec != "freq-keep-k":
        if args.precision_bits is not None:
            raise CliError(f"--precision-bits is band-keep's analogue precision; codec {args.codec} has none "
                           "(valid: --codec freq-keep-k)")
        return {}
    params: dict = {"keep": args.keep, "sinks": args.sinks}
    if args.precision_bits is not None:
        params["precision_bits"] = args.precision_bits
    return params


def run(args: argparse.Namespace) -> int:
    import asyncio

    from kvtransit.cli._model_args import model_from_args
    from kvtransit.cli.accuracy import default_sample_path
    from kvtransit.flows.ring.run import offline_errors, plan_ring, run_ring
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.links import link_by_name
    from kvtransit.model.field_checks import module_budget
    from kvtransit.model.module.budget import Module, Policy, budget_ops_per_byte

    sample = args.sample or str(default_sample_path())
    module = Module(ops_per_byte=budget_ops_per_byte(module_budget(args.module_budget)))
    plan = plan_ring(model_from_args(args), device_by_name(args.device), link_by_name(args.ring_link),
                     n=args.ring_ranks, context=args.ring_prompt, sample=sample, text=args.text, codec=args.codec,
                     codec_params=_codec_params(args), module=module,
                     policy=Policy(args.policy), prompts=args.prompts, dilation=args.dilation,
                     wire_dtype=args.wire_dtype, transform_charged=args.transform_charged)
    report = asyncio.run(run_ring(plan))
    report.offline = offline_errors(plan)
    summary = report.summary()
    if args.json:
        print_json(summary)
        return 0 if report.ok else 1
    print_report(summary)
    return 0 if report.ok else 1


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * MS:,.3f}"


def print_report(s: dict) -> None:
    codec = s["codec"] + "".join(f" {k}={v}" for k, v in s["codec_params"].items())
    where = {"transit": "in transit", "gpu": "at the GPUs", "-": ""}[s["runs_on"]]
    bound = "link-bound" if s["model_link_bound"] else "compute-bound"
    print_table(
        f"ring attention: {s['model']} on {s['n']} x {s['device']}, {s['context']:,} tokens "
        f"({s['block_tokens']:,} a block), over {s['link']}, codec {codec} {where}".rstrip(),
        ["", "hop (ms)", f"prompt, {s['layers']} layers (ms)"],
        [["model (declared ratio)", _ms(s["model_hop_s"]), _ms(s["model_prompt_s"])],
         ["model (measured ratio)", _ms(s["model_hop_at_measured_ratio_s"]),
          _ms(s["model_prompt_at_measured_ratio_s"])],
         ["measured", _ms(s["measured_hop_s"]), _ms(s["measured_prompt_s"])],
         ["measured − model", "", "-" if math.isnan(s["prompt_error"]) else f"{s['prompt_error']:+.1%}"]],
        caption=(f"model hop: link {_ms(s['model_hop_link_s'])} ms, blockwise attention "
                 f"{_ms(s['model_hop_compute_s'])} ms ({bound}); wire ratio declared {s['declared_ratio']:.3f}, "
                 f"measured {s['measured_ratio']:.3f}; hops a layer {sorted(set(s['hops_per_layer'])) or '-'}; "
                 f"scale {s['scale']:.4g} ({s['kv']}), dilation {s['dilation']:g} ({s['dilation_why']}); "
                 f"measured hop = due start to done, median over ranks"))
    print(f"faithful: {s['faithful_line']}")
    if s["budget"]:
        print(f"module: {s['budget']}")
    acc, offline = s["accuracy"], s["offline"]
    if acc:
        line = (f"accuracy: the ring's attention-output error {acc['out_err_ring']:.4f} live ({acc['layers']} layers, "
                f"{acc['queries']} queries x {acc['heads']} heads, blocks of {acc['block_tokens']} tokens)")
        if offline:
            line += (f"; offline: {offline['ring']:.4f} for the ring, one pass {offline['one_pass']:.4f}, "
                     f"{s['n'] - 1} hops {offline['after_n_minus_1_hops']:.4f}")
        print(line)
    for failure in s["failures"]:
        print(f"FAILED: {failure}")
