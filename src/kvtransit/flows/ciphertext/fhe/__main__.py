"""`python -m kvtransit.flows.ciphertext.fhe [--requests N] [--link NAME | --rate-Bps R --latency-s L] [--dilation
auto|D]`: an encrypted 64 × 64 layer served across an emulated loopback link; prints the report as JSON (or the one-line
"not installed")."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from kvtransit.flows.ciphertext.encrypted_layer import NotInstalled, dilated_layer
from kvtransit.flows.ciphertext.serial_dilation import dilation_arg
from kvtransit.model.catalog.links import link_by_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtransit.flows.ciphertext.fhe", description=__doc__)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--link", help="a catalogued link (docs/reference.md §2), e.g. eth-100g")
    parser.add_argument("--rate-Bps", type=float, default=100e6)
    parser.add_argument("--latency-s", type=float, default=0.001)
    parser.add_argument("--dilation", type=dilation_arg, default="auto",
                        help="time dilation (>= 1), or auto: the least that holds the host's measured cost of a "
                             "request's ciphertexts within the model's band")
    args = parser.parse_args(argv)
    rate, latency = args.rate_Bps, args.latency_s
    if args.link:
        link = link_by_name(args.link)
        rate, latency = link.bandwidth_Bps, link.latency_s
    try:
        report = asyncio.run(dilated_layer(args.requests, rate_Bps=rate, latency_s=latency, dilation=args.dilation))
    except NotInstalled as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=1))
    return 0 if report.within_tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
