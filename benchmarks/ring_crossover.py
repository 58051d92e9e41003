"""Ring attention live: where a codec on the ring's links starts to pay, measured against the model.

    python benchmarks/ring_crossover.py [--link eth-100g] [--n 4] [--blocks 2048 4096 8192 12288 16384 32768]

For each block size (tokens a rank holds; the prompt is n blocks), two live rings of n rank processes
(`kvtransit ring`, flows/ring/run.py) run side by side in one run: no codec, and band-keep (keep 0.5, 4 sinks)
in transit on every hop. Printed per block: the model's hop (link leg, blockwise attention; link- or
compute-bound), the prompt's time measured and modelled for each, and the saving the codec buys (1 − codec /
none), measured and modelled. The measured crossover is the largest block whose measured saving is over
SAVING_NOISE; the model's is flows/ring/model.py's `crossover_block_tokens` (the largest block whose raw hop is
link-bound). The modelled saving uses the wire ratio the codec measured on the real blocks (the sample's short
blocks keep 4 sinks in 96 tokens, so 1.92, not the declared 2.0).
"""

from __future__ import annotations

import argparse
import asyncio

from kvtransit.cli.accuracy import default_sample_path
from kvtransit.flows.ring.model import crossover_block_tokens
from kvtransit.flows.ring.run import plan_ring, run_ring
from kvtransit.model.catalog.devices import device_by_name
from kvtransit.model.catalog.links import link_by_name
from kvtransit.model.catalog.models import model_by_name

# A saving under this is within the noise of a prompt on this 2-core box (the ring's prompts measured 0.2-1.2 %
# off the model at light load, RESULTS.md "Ring attention, live").
SAVING_NOISE = 0.02
BAND_KEEP = {"keep": 0.5, "sinks": 4}


def run_point(model, device, link, n: int, block: int, codec: str, prompts: int) -> dict:
    plan = plan_ring(model, device, link, n=n, context=n * block, sample=str(default_sample_path()), codec=codec,
                     codec_params=BAND_KEEP if codec != "none" else {}, prompts=prompts)
    report = asyncio.run(run_ring(plan))
    if not report.ok:
        raise SystemExit(f"block {block}, codec {codec}: {report.failures}")
    return report.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--link", default="eth-100g")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--blocks", type=int, nargs="+", default=[2048, 4096, 8192, 12288, 16384, 32768])
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    model, device, link = model_by_name(args.model), device_by_name(args.gpu), link_by_name(args.link)
    print(f"ring attention, {model.name} on {args.n} x {device.name} over {link.name}; codec freq-keep-k "
          f"keep 0.5, 4 sinks in transit vs none; {args.prompts} prompts a point (the first a warm-up)")
    print(f"{'block':>7} {'link ms':>8} {'attn ms':>8} {'bound':>8} {'dil':>4} {'none meas/model ms':>19} "
          f"{'codec meas/model ms':>20} {'saving meas':>12} {'saving model':>13}")
    measured_crossover = None
    for block in args.blocks:
        raw = run_point(model, device, link, args.n, block, "none", args.prompts)
        coded = run_point(model, device, link, args.n, block, "freq-keep-k", args.prompts)
        saving = 1 - coded["measured_prompt_s"] / raw["measured_prompt_s"]
        saving_model = 1 - coded["model_prompt_at_measured_ratio_s"] / raw["model_prompt_at_measured_ratio_s"]
        if saving > SAVING_NOISE:
            measured_crossover = block
        bound = "link" if raw["model_link_bound"] else "compute"
        print(f"{block:>7,} {raw['model_hop_link_s'] * 1e3:>8.3f} {raw['model_hop_compute_s'] * 1e3:>8.3f} "
              f"{bound:>8} {max(raw['dilation'], coded['dilation']):>4.1f} "
              f"{raw['measured_prompt_s'] * 1e3:>9.1f}/{raw['model_prompt_at_measured_ratio_s'] * 1e3:<9.1f} "
              f"{coded['measured_prompt_s'] * 1e3:>10.1f}/{coded['model_prompt_at_measured_ratio_s'] * 1e3:<9.1f} "
              f"{saving:>12.1%} {saving_model:>13.1%}")
    model_crossover = crossover_block_tokens(model, device, link)
    shown = "none of these" if measured_crossover is None else f"{measured_crossover:,} tokens"
    modelled = "no block" if model_crossover is None else f"up to {model_crossover:,} tokens"
    print(f"measured: the codec pays (saving > {SAVING_NOISE:.0%}) up to blocks of {shown}; the model: a raw hop is "
          f"link-bound {modelled}")


if __name__ == "__main__":
    main()
