"""Measurement endpoints run inside a namespace: `python -m kvtransit.shaping.measure ROLE ...`.

Roles (each prints one JSON line on stdout when it has something to say):
- sink HOST PORT --warmup S  : accept one TCP connection, count bytes to EOF, report goodput measured at the
                               receiver after the warm-up (so the shaper's initial burst and slow start are out).
- bulk HOST PORT --seconds S : connect and send as fast as the socket takes it for S seconds.
- echo HOST PORT             : accept one connection and echo each message back (for ping-pong RTT).
- rtt HOST PORT --count N    : send N small messages one at a time, report each round-trip time.

Plain blocking sockets and time.perf_counter: the measured host is the shaped link, not this tool.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from typing import Any

CHUNK = 256 * 1024  # large writes so the sender is never the bottleneck (Python per-call overhead amortised)
PING_BYTES = 64  # one small segment per direction, like ping


def _announce(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _listen(host: str, port: int) -> socket.socket:
    server = socket.create_server((host, port), reuse_port=False)
    _announce(ready=True, port=server.getsockname()[1])
    return server


def sink(host: str, port: int, warmup_s: float) -> None:
    with _listen(host, port) as server:
        conn, _ = server.accept()
    buf = bytearray(CHUNK)
    total = 0
    first = mark_t = None
    mark_bytes = 0
    with conn:
        while True:
            n = conn.recv_into(buf)
            now = time.perf_counter()
            if not n:
                break
            if first is None:
                first = now
            total += n
            if mark_t is None and now - first >= warmup_s:
                mark_t, mark_bytes = now, total
            last = now
    if first is None:
        _announce(error="no bytes received")
        return
    if mark_t is None or last <= mark_t:  # transfer shorter than the warm-up: measure all of it
        mark_t, mark_bytes = first, 0
    _announce(bytes=total, seconds=last - mark_t, goodput_Bps=(total - mark_bytes) / (last - mark_t))


def bulk(host: str, port: int, seconds: float) -> None:
    payload = bytes(CHUNK)
    with socket.create_connection((host, port)) as conn:
        end = time.perf_counter() + seconds
        sent = 0
        while time.perf_counter() < end:
            conn.sendall(payload)
            sent += len(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # wait for the sink to close: every byte has crossed the link
    _announce(sent=sent)


def echo(host: str, port: int) -> None:
    with _listen(host, port) as server:
        conn, _ = server.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            data = conn.recv(PING_BYTES)
            if not data:
                return
            conn.sendall(data)


def rtt(host: str, port: int, count: int) -> None:
    samples = []
    with socket.create_connection((host, port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = bytes(PING_BYTES)
        for _ in range(count):
            t0 = time.perf_counter()
            conn.sendall(msg)
            got = 0
            while got < PING_BYTES:
                part = conn.recv(PING_BYTES - got)
                if not part:
                    raise SystemExit("echo peer closed early")
                got += len(part)
            samples.append(time.perf_counter() - t0)
    _announce(rtt_s=samples, median_s=statistics.median(samples))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtransit.shaping.measure")
    parser.add_argument("role", choices=("sink", "bulk", "echo", "rtt"))
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--count", type=int, default=50)
    args = parser.parse_args(argv)
    if args.role == "sink":
        sink(args.host, args.port, args.warmup)
    elif args.role == "bulk":
        bulk(args.host, args.port, args.seconds)
    elif args.role == "echo":
        echo(args.host, args.port)
    else:
        rtt(args.host, args.port, args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
