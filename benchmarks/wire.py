"""Wire micro-benchmark: receive (parse + CRC32C) throughput of 8 MiB KV chunks vs a bare memcpy.

    python benchmarks/wire.py [--chunks 64] [--chunk-mib 8]

Receive path measured: bytes are written into the connection's own buffer through get_buffer() /
buffer_updated() (the copy a socket read would do), then next_event() parses the header and checks the
payload CRC, delivering a view. The baseline is the same copy alone, so the ratio is the wire's overhead.
Send path: send_parts() (header + one CRC pass, payload not copied).
"""

from __future__ import annotations

import argparse
import os
import time

from kvtransit.wire import NEED_DATA, Connection, DType, Role, events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--chunk-mib", type=int, default=8)
    args = ap.parse_args()
    size = args.chunk_mib << 20
    payload = os.urandom(size)
    n = args.chunks

    tx = Connection(Role.PREFILL, Role.MIDDLEBOX)
    hello = tx.send(events.Hello(Role.PREFILL, 1, "bench"))
    begin = tx.send(events.KvBegin(1, 8, 4, n, n, n * size, "none", 0))
    frames = []
    t0 = time.perf_counter()
    for i in range(n):
        frames.append(tx.send_parts(events.KvChunk(1, i, i, DType.U8, (size,), 0, b"", payload, size)))
    send_s = time.perf_counter() - t0
    wire = [bytes(h) + bytes(p) for h, p in frames]

    rx = Connection(Role.MIDDLEBOX, Role.PREFILL)
    rx.receive_data(hello + begin)
    while rx.next_event() is not NEED_DATA:
        pass
    copy_s = parse_s = 0.0
    for frame in wire:
        pos = 0
        while pos < len(frame):
            t0 = time.perf_counter()
            buf = rx.get_buffer(len(frame) - pos)
            k = min(len(buf), len(frame) - pos)
            buf[:k] = memoryview(frame)[pos:pos + k]  # stands in for recv_into
            del buf
            rx.buffer_updated(k)
            t1 = time.perf_counter()
            event = rx.next_event()
            t2 = time.perf_counter()
            copy_s += t1 - t0
            parse_s += t2 - t1
            pos += k
        assert isinstance(event, events.KvChunk) and event.payload.nbytes == size
        del event

    dst = bytearray(size + 128)
    t0 = time.perf_counter()
    for frame in wire:
        dst[:len(frame)] = frame  # bare memcpy of the same bytes
    memcpy_s = time.perf_counter() - t0

    total = n * size / 1e9
    recv_gbs = total / (copy_s + parse_s)
    memcpy_gbs = total / memcpy_s
    print(f"chunks: {n} × {args.chunk_mib} MiB")
    print(f"bare memcpy:                 {memcpy_gbs:6.2f} GB/s")
    print(f"receive (copy+parse+CRC):    {recv_gbs:6.2f} GB/s  ratio {recv_gbs / memcpy_gbs:.2f} of memcpy")
    print(f"  parse+CRC alone:           {total / parse_s:6.2f} GB/s")
    print(f"send_parts (header+CRC):     {total / send_s:6.2f} GB/s")


if __name__ == "__main__":
    main()
