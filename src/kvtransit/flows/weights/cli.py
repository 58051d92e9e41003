"""`kvtransit weights`: weight streaming live, a cold start and LoRA adapters paged in on demand.

    kvtransit weights --model llama3-8b --link eth-25g --adapters 100 --rank 16 --adapter-capacity 8 --requests 40
    kvtransit weights --codec zstd --policy host

Two processes over a shaped link (flows/weights/roles.py): a store, and an instance that is unavailable until its BF16
weights have streamed in (the cold start, measured), then serves --requests (Poisson at --rate, each naming one of
--adapters adapters by a Zipf popularity) one at a time: an adapter not among its --capacity resident ones (an LRU)
is paged in over the link before the prefill, so the request's TTFT includes the wait. A weight flow needs a
lossless kernel: a lossy one is refused before anything runs; `zstd` (the lossless compressor a user would try)
branches on the data, which the module does not publish, so it runs at the store and the instance with --policy
host. Every byte that arrives is checked against what was sent. Printed: the cold start and the TTFTs (paged-in and
resident) measured beside the model's for the same requests, the scale and the dilation. The flags it shares with
`kvtransit up` are spelled as there (docs/flags.md; `--kernel NAME` was this command's spelling of `--codec`, and
`--kernel FILE` is a declared kernel everywhere else).
"""

from __future__ import annotations

import argparse
import math

from kvtransit.cli._common import add_json_flag, number_or_auto, print_json, print_table

MS = 1e3


def register(subparsers) -> None:
    from kvtransit.cli._model_args import add_model_flags
    from kvtransit.cli.scenario_flags import add_scenario_flag
    from kvtransit.model.catalog.devices import DEVICES

    p = subparsers.add_parser("weights", help="weight streaming: a cold start and adapters paged in, live",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p, default="llama3-8b")
    add_scenario_flag(p, "device", aliases=("--gpu",), choices=sorted(DEVICES))
    add_scenario_flag(p, "link", help="the link from the store")
    add_scenario_flag(p, "codec", aliases=("--kernel",), default="none",
                      help="the kernel on the flow: none, zstd, or a KV codec (refused: not lossless)")
    add_scenario_flag(p, "policy", choices=("reject", "host"),
                      help="a kernel the module cannot run (zstd branches on the data): refuse it, or run it at the "
                           "hosts")
    p.add_argument("--adapters", type=int, default=100, help="LoRA adapters in the store (default 100)")
    p.add_argument("--rank", type=int, default=16, help="their rank (default 16)")
    p.add_argument("--adapter-capacity", "--capacity", dest="capacity", type=int, default=8,
                   help="adapters resident on the instance (default 8; --capacity: the old spelling, for one release)")
    add_scenario_flag(p, "requests", default=40, help="requests")
    add_scenario_flag(p, "rate", default=2.0, help="their Poisson rate, req/s")
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens a request (default 2048)")
    p.add_argument("--zipf", type=float, default=1.0, help="the adapters' Zipf exponent (default 1; 0: uniform)")
    add_scenario_flag(p, "seed", default=0, help="the workload's seed")
    p.add_argument("--scale", type=number_or_auto, default="auto",
                   help="every byte and the link's rate at this scale (default auto: what this host carries)")
    p.add_argument("--dilation", type=number_or_auto, default="auto",
                   help="stretch every modelled duration (default auto: what this host can carry)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from kvtransit.cli._model_args import model_from_args
    from kvtransit.flows.weights.run import plan_weights, run_weights
    from kvtransit.model.catalog.devices import device_by_name
    from kvtransit.model.catalog.links import link_by_name
    from kvtransit.model.module.budget import Policy

    plan = plan_weights(model_from_args(args), device_by_name(args.device), link_by_name(args.link),
                        kernel=args.codec, policy=Policy(args.policy), adapters=args.adapters, rank=args.rank,
                        capacity=args.capacity, requests=args.requests, rate=args.rate, prompt_tokens=args.prompt,
                        zipf=args.zipf, seed=args.seed, scale=args.scale, dilation=args.dilation)
    report = asyncio.run(run_weights(plan))
    summary = report.summary()
    if args.json:
        print_json(summary)
        return 0 if report.ok else 1
    print_report(summary)
    return 0 if report.ok else 1


def _ms(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * MS:,.2f}"


def _pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:+.2%}"


def print_report(s: dict) -> None:
    where = {"-": "", "hosts": " at the store and the instance", "transit": " in transit"}[s["runs_at"]]
    if s["ok"]:
        print_table(
            f"weight streaming: {s['model']} on {s['device']} over {s['link']}, kernel {s['kernel']}{where}",
            ["", "model (ms)", "measured (ms)", "measured − model"],
            [["cold start (the weights, before serving)", _ms(s["model_cold_start_s"]), _ms(s["cold_start_s"]),
              _pct(s["cold_start_error"])],
             ["TTFT, median of all requests", _ms(s["model_ttft_median_s"]), _ms(s["ttft_median_s"]), ""],
             [f"TTFT of a paged-in adapter ({s['misses']} misses)", "", _ms(s["miss_ttft_median_s"]),
              _pct(s["miss_ttft_error_median"])],
             [f"TTFT of a resident adapter ({s['hits']} hits)", "", "", _pct(s["hit_ttft_error_median"])]],
            caption=(f"{s['requests']} requests at {s['rate_rps']:g}/s, {s['adapters']} rank-{s['rank']} adapters "
                     f"({s['adapter_bytes'] / 1e6:,.1f} MB each) by Zipf, {s['capacity']} resident; prefill "
                     f"{_ms(s['model_prefill_s'])} ms held; wire ratio {s['wire_ratio']:.3f}; misses "
                     f"{s['misses']} (model {s['model_misses']}); worst request {_pct(s['ttft_error_max'])}; "
                     f"scale {s['scale']:.4g} ({s['scale_why']}), dilation {s['dilation']:g} ({s['dilation_why']})"))
        verdict = "within" if s["within_target"] else "NOT within"
        print(f"a paged-in adapter's TTFT is {verdict} 2 % of the model (median {_pct(s['miss_ttft_error_median'])})")
    print(f"faithful: {s['faithful_line']}")
    for failure in s["failures"]:
        print(f"FAILED: {failure}")
