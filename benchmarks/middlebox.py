"""Middlebox relay throughput vs a bare blocking-socket relay, measured side by side in one run.

    python benchmarks/middlebox.py [--mb 256] [--chunk-mib 8] [--repeats 3]

Three processes each time: this one is the source and the sink (asyncio + uvloop, the same code for every
case), and a relay in between:
  bare        a blocking-socket byte relay (recv_into + sendall, one thread): the ceiling for any relay
  passthrough `kvtransit middlebox --codec none` on an unshaped link (nvlink4 at scale 1: 450 GB/s)
  band-keep   `kvtransit middlebox --codec freq-keep-k --keep 0.5` on the same link, float32 KV
The source streams KvBegin, `MB` of KvChunk frames, KvEnd; the sink counts payload bytes (and acks, for
the middlebox). Throughput is source payload bytes over the time from first send to last byte at the sink.
Targets: passthrough >= 0.8 x bare, band-keep >= 0.5 x bare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from kvtransit.runtime.loop import run
from kvtransit.runtime.transport import open_endpoint, serve
from kvtransit.wire import WIRE_VERSION
from kvtransit.wire.events import Ack, AckStatus, DType, Hello, KvBegin, KvChunk, KvEnd, Role

HEAD_DIM = 128  # one llama3-8b head (docs/reference.md §1)


def bare_relay(listen_port_out: list, dest: tuple[str, int]) -> None:
    """Blocking byte relay: accept one connection, copy to `dest` until EOF."""
    server = socket.create_server(("127.0.0.1", 0))
    listen_port_out.append(server.getsockname()[1])
    conn, _ = server.accept()
    out = socket.create_connection(dest)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        out.sendall(view[:n])
    out.shutdown(socket.SHUT_WR)
    out.close()
    conn.close()
    server.close()


def chunks_for(total_bytes: int, chunk_bytes: int, dtype: DType) -> tuple[list[KvChunk], int]:
    itemsize = dtype.itemsize
    tokens = chunk_bytes // (HEAD_DIM * itemsize)
    rng = np.random.default_rng(0)
    block = rng.standard_normal((1, tokens, HEAD_DIM), dtype=np.float32)
    if dtype is DType.BF16:
        import ml_dtypes
        block = block.astype(ml_dtypes.bfloat16)
    payload = memoryview(block.reshape(-1).view(np.uint8))
    n = max(1, total_bytes // payload.nbytes)
    chunks = [KvChunk(request_id=1, layer=0, chunk=i, dtype=dtype, shape=block.shape, codec_id=0, codec_header=b"",
                      payload=payload, raw_bytes=payload.nbytes) for i in range(n)]
    return chunks, n * payload.nbytes


async def measure(case: str, total_bytes: int, chunk_bytes: int) -> float:
    dtype = DType.F32 if case == "band-keep" else DType.BF16
    chunks, payload_total = chunks_for(total_bytes, chunk_bytes, dtype)
    done = asyncio.get_running_loop().create_future()
    received = 0

    if case == "bare":
        async def sink_raw(reader, writer):
            nonlocal received
            while data := await reader.read(1 << 20):
                received += len(data)
            done.set_result(time.perf_counter())
            writer.close()
        sink = await asyncio.start_server(sink_raw, "127.0.0.1", 0)
        sink_port = sink.sockets[0].getsockname()[1]
        # The relay runs in a process of its own, as the middlebox does.
        # Popen only forks; the benchmark starts the child before it measures anything.
        proc = subprocess.Popen([sys.executable, __file__, "--bare-child", str(sink_port)],  # noqa: ASYNC220
                                stdout=subprocess.PIPE, text=True)
        relay_port = int(proc.stdout.readline())
    else:
        async def sink_decode(endpoint):
            nonlocal received
            await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name="bench-sink"))
            async for event in endpoint:
                if isinstance(event, KvChunk):
                    received += event.raw_bytes
                elif isinstance(event, KvEnd):
                    done.set_result(time.perf_counter())
                    await endpoint.send(Ack(request_id=event.request_id, status=AckStatus.OK))
        sink = await serve("127.0.0.1", 0, sink_decode, Role.DECODE, Role.MIDDLEBOX)
        codec = ["--codec", "none"] if case == "passthrough" else ["--codec", "freq-keep-k", "--keep", "0.5"]
        proc = subprocess.Popen([sys.executable, "-m", "kvtransit.cli", "middlebox", "--decode",  # noqa: ASYNC220
                                 f"127.0.0.1:{sink.port}", "--link", "nvlink4", "--scale", "1", *codec],
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        relay_port = json.loads(proc.stdout.readline().removeprefix("KVTRANSIT-READY "))["listen_port"]

    source = await open_endpoint("127.0.0.1", relay_port, Role.PREFILL, Role.MIDDLEBOX)
    await source.send(Hello(role=Role.PREFILL, version=WIRE_VERSION, name="bench-source"))
    start = time.perf_counter()
    await source.send(KvBegin(request_id=1, prompt_tokens=1, output_tokens=1, n_layers=1, n_chunks=len(chunks),
                              raw_bytes=payload_total, codec="none", first_token_ns=0))
    for chunk in chunks:
        await source.send(chunk)
    await source.send(source.connection.kv_end(1))
    if case == "bare":
        source.close()
    async with asyncio.timeout(300):
        end = await done
    source.abort()
    proc.terminate()
    proc.wait(10)
    if case == "bare":
        sink.close()
    else:
        await sink.shutdown(1.0)
    return payload_total / (end - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="payload per run, MB (default 256)")
    parser.add_argument("--chunk-mib", type=int, default=8, help="KvChunk payload size, MiB (default 8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bare-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_child:
        ports: list = []
        thread = threading.Thread(target=bare_relay, args=(ports, ("127.0.0.1", args.bare_child)))
        thread.start()
        while not ports:
            time.sleep(0.001)
        print(ports[0], flush=True)
        thread.join()
        return
    results: dict[str, list[float]] = {"bare": [], "passthrough": [], "band-keep": []}
    for _ in range(args.repeats):  # interleaved, so drift on a shared box hits every case alike
        for case in results:
            results[case].append(run(measure(case, args.mb * 1_000_000, args.chunk_mib << 20)))
    bare = statistics.median(results["bare"])
    print(f"{'case':<12} {'GB/s (median)':>14} {'runs':>30} {'x bare':>8}")
    for case, values in results.items():
        median = statistics.median(values)
        runs = " ".join(f"{v:.2f}" for v in values)
        print(f"{case:<12} {median:>14.2f} {runs:>30} {median / bare:>8.2f}")


if __name__ == "__main__":
    main()
