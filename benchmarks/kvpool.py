"""KV pool fetch throughput on loopback, against a bare socket relay of the same bytes.

    python benchmarks/kvpool.py [--blocks 64] [--block-mib 1] [--repeat 5]

One run, same box, same bytes (`--blocks` blocks of `--block-mib` MiB, fetched whole, again and again):
- bare-socket: a child process answers each 8-byte request with the bytes via sendall from one buffer; the
  client recv_into's them (no framing, no checks: the loopback ceiling for this request/response shape).
- kvpool-direct: `kvtransit kvpool` (a child process) serves PoolFetch from memory; the client speaks the
  wire as a middlebox would (PoolHit, KvBegin, CRC-checked KvChunks, KvEnd).
- kvpool-via-middlebox: the same, through `kvtransit middlebox --kvpool` (the prefill's real path: pool →
  middlebox → prefill), its link nvlink4 at scale 1 (450 GB/s, so the shaper never binds: this measures the
  relay's host cost, not a link).
Prints GB/s (1e9 bytes/s of KV payload fetched) and the ratio to the bare socket.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time

from kvtransit.flows.tier.prefix import chain
from kvtransit.runtime.loop import run
from kvtransit.runtime.transport import open_endpoint, serve
from kvtransit.wire.events import DType, Hello, KvBegin, KvChunk, KvEnd, PoolFetch, PoolHit, PoolPut, Role
from kvtransit.wire.limits import WIRE_VERSION

CLI = [sys.executable, "-m", "kvtransit.cli"]
# nvlink4 at scale 1: 450 GB/s (docs/reference.md §2), far above loopback, so the middlebox's shaper never binds.
FAST = ["--link", "nvlink4", "--scale", "1", "--codec", "none", "--kv-pool", "pool"]


def _bare_server(port_queue, total: int) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port_queue.put(server.getsockname()[1])
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = memoryview(bytes(total))
    while conn.recv(8):
        conn.sendall(data)
    conn.close()


def bare_socket(total: int, repeat: int) -> list[float]:
    queue = multiprocessing.Queue()
    child = multiprocessing.Process(target=_bare_server, args=(queue, total), daemon=True)
    child.start()
    sock = socket.create_connection(("127.0.0.1", queue.get(timeout=10)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(4 * 1024 * 1024)
    rates = []
    for _ in range(repeat):
        started = time.perf_counter()
        sock.sendall(b"fetch!!!")
        got = 0
        while got < total:
            got += sock.recv_into(buf)
        rates.append(total / (time.perf_counter() - started) / 1e9)
    sock.close()
    child.join(5)
    return rates


async def _start(argv: list[str]) -> tuple[asyncio.subprocess.Process, dict]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    async with asyncio.timeout(60):
        line = (await proc.stdout.readline()).decode()
    return proc, json.loads(line.removeprefix("KVTRANSIT-READY "))


async def _connect(port: int, our: Role, their: Role):
    endpoint = await open_endpoint("127.0.0.1", port, our, their)
    await endpoint.send(Hello(role=our, version=WIRE_VERSION, name="bench"))
    await endpoint.next_event()
    return endpoint


async def _fetch_all(endpoint, rid: int, ids: tuple[int, ...]) -> int:
    await endpoint.send(PoolFetch(request_id=rid, hash_ids=ids))
    payload = 0
    while True:
        event = await endpoint.next_event()
        if isinstance(event, PoolHit) and event.blocks == 0:
            raise RuntimeError("the pool holds none of the blocks")
        if isinstance(event, KvChunk):
            payload += len(event.payload)
        elif isinstance(event, KvEnd):
            return payload


async def pool_runs(blocks: int, block_bytes: int, repeat: int) -> dict[str, list[float]]:
    ids = chain([("bench", k) for k in range(blocks)])
    pool, pool_ready = await _start([*CLI, "kvpool", *FAST, "--capacity", str(4 * blocks * block_bytes)])
    procs = [pool]
    idle = await serve("127.0.0.1", 0, _idle_decode, Role.DECODE, Role.MIDDLEBOX)
    try:
        direct = await _connect(pool_ready["listen_port"], Role.MIDDLEBOX, Role.KVPOOL)
        # Fill the pool: one put of every block, raw (one chunk a block).
        payload = bytes(range(256)) * (block_bytes // 256)
        await direct.send(PoolPut(request_id=1, hash_ids=ids))
        await direct.send(KvBegin(request_id=1, prompt_tokens=blocks * 512, output_tokens=1, n_layers=1,
                                  n_chunks=blocks, raw_bytes=blocks * block_bytes, codec="none", first_token_ns=0))
        for k in range(blocks):
            await direct.send(KvChunk(request_id=1, layer=0, chunk=k, dtype=DType.U8, shape=(block_bytes,),
                                      codec_id=0, codec_header=b"", payload=payload, raw_bytes=block_bytes))
        await direct.send(direct.connection.kv_end(1))
        await direct.next_event()  # the Ack
        results = {"kvpool-direct": [], "kvpool-via-middlebox": []}
        for r in range(repeat):
            started = time.perf_counter()
            n = await _fetch_all(direct, 100 + r, ids)
            results["kvpool-direct"].append(n / (time.perf_counter() - started) / 1e9)
        mb, mb_ready = await _start([*CLI, "middlebox", *FAST, "--decode", f"127.0.0.1:{idle.port}",
                                     "--kvpool", f"127.0.0.1:{pool_ready['listen_port']}"])
        procs.append(mb)
        via = await _connect(mb_ready["pool_port"], Role.PREFILL, Role.MIDDLEBOX)
        for r in range(repeat):
            started = time.perf_counter()
            n = await _fetch_all(via, 200 + r, ids)
            results["kvpool-via-middlebox"].append(n / (time.perf_counter() - started) / 1e9)
        return results
    finally:
        for proc in reversed(procs):
            proc.terminate()
            await proc.wait()
        await idle.shutdown(1.0)


async def _idle_decode(endpoint) -> None:
    await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name="idle"))
    async for _ in endpoint:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--block-mib", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    block_bytes = args.block_mib * 1024 * 1024
    total = args.blocks * block_bytes
    rows = {"bare-socket": bare_socket(total, args.repeat)}
    rows.update(run(pool_runs(args.blocks, block_bytes, args.repeat), loop="uvloop"))
    base = statistics.median(rows["bare-socket"])
    print(f"{args.blocks} blocks x {args.block_mib} MiB per fetch, median of {args.repeat}")
    print(f"{'path':<24}{'GB/s':>8}{'vs bare':>9}")
    for name, rates in rows.items():
        rate = statistics.median(rates)
        print(f"{name:<24}{rate:8.2f}{rate / base:9.2f}")


if __name__ == "__main__":
    main()
