"""`python -m kvtransit.flows.ciphertext [--sessions N] [--link NAME | --rate-Bps R --latency-s L] [--dilation auto|D]
[--kem compiled|python]`: ML-KEM-768 handshakes across an emulated loopback link; prints the report as JSON (or the
one-line "not installed")."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from kvtransit.flows.ciphertext.handshake import NotInstalled, dilated_handshakes
from kvtransit.flows.ciphertext.kem import DEFAULT_KEM, KEMS
from kvtransit.flows.ciphertext.serial_dilation import dilation_arg
from kvtransit.model.catalog.links import link_by_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtransit.flows.ciphertext", description=__doc__)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--link", help="a catalogued link (docs/reference.md §2), e.g. eth-100g")
    parser.add_argument("--rate-Bps", type=float, default=1e6)
    parser.add_argument("--latency-s", type=float, default=0.002)
    parser.add_argument("--dilation", type=dilation_arg, default="auto",
                        help="time dilation (>= 1), or auto: the least that holds the host's measured cost of a "
                             "handshake within the model's band")
    parser.add_argument("--kem", choices=KEMS, default=DEFAULT_KEM,
                        help="compiled: the cryptography package's ML-KEM (OpenSSL; default); python: kyber-py")
    args = parser.parse_args(argv)
    rate, latency = args.rate_Bps, args.latency_s
    if args.link:
        link = link_by_name(args.link)
        rate, latency = link.bandwidth_Bps, link.latency_s
    try:
        report = asyncio.run(dilated_handshakes(args.sessions, rate_Bps=rate, latency_s=latency,
                                                dilation=args.dilation, kem=args.kem))
    except NotInstalled as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=1))
    return 0 if (report.all_secrets_equal and (report.ntt_check is None or report.ntt_check.ok)
                 and report.reference_agrees is not False) else 1


if __name__ == "__main__":
    sys.exit(main())
