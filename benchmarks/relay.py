"""Relay throughput on loopback: a bare blocking-socket relay vs the asyncio BufferedProtocol relays (uvloop).

    python benchmarks/relay.py [--mib 256] [--repeat 3]

One run, same box, same byte stream (Hello, KvBegin, 1 MiB KvChunks, KvEnd: what prefill sends a middlebox):
- blocking: a thread doing recv_into / sendall on plain sockets, no parsing (the ceiling).
- raw-protocol: an asyncio.BufferedProtocol that writes what it reads, no parsing (the framework's cost).
- framed-endpoint: kvtransit.runtime.transport Endpoints: parse every frame (CRC32C checked), re-encode its
  header for the next hop and forward the payload view without copying (the middlebox's real path).
The source and the sink run in a child process so they do not share the relay's interpreter lock.
Prints GB/s (1e9 bytes/s, of bytes relayed) and the ratio to the blocking relay.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import threading
import time

import uvloop

from kvtransit.runtime.loop import run
from kvtransit.runtime.transport import open_endpoint, serve
from kvtransit.wire import Connection, Role
from kvtransit.wire.events import DType, Hello, KvBegin, KvChunk
from kvtransit.wire.limits import WIRE_VERSION

CHUNK = 1024 * 1024
READ = 256 * 1024


def frames(mib: int) -> list[bytes]:
    """The whole stream prefill→middlebox, encoded once (payload shared, so memory stays small)."""
    conn = Connection(our_role=Role.PREFILL, their_role=Role.MIDDLEBOX)
    payload = bytes(range(256)) * (CHUNK // 256)
    out = [conn.send(Hello(role=Role.PREFILL, version=WIRE_VERSION, name="bench")),
           conn.send(KvBegin(request_id=1, prompt_tokens=1, output_tokens=1, n_layers=mib, n_chunks=mib,
                             raw_bytes=mib * CHUNK, codec="none", first_token_ns=0))]
    for i in range(mib):
        out += conn.send_parts(KvChunk(request_id=1, layer=i, chunk=i, dtype=DType.U8, shape=(CHUNK,), codec_id=0,
                                       codec_header=b"", payload=payload, raw_bytes=CHUNK))
    out.append(conn.send(conn.kv_end(1)))
    return [bytes(p) if not isinstance(p, bytes) else p for p in out]


def _source_and_sink(relay_port: int, sink_ready, results, mib: int) -> None:
    """Child process: listen as the sink, then stream the frames into the relay; report bytes and seconds."""
    sink = socket.create_server(("127.0.0.1", 0))
    sink_ready.put(sink.getsockname()[1])
    stream = frames(mib)
    done = {}

    def drain():
        conn, _ = sink.accept()
        buf = bytearray(READ)
        total = 0
        while n := conn.recv_into(buf):
            total += n
        done["bytes"], done["end"] = total, time.perf_counter()

    reader = threading.Thread(target=drain)
    reader.start()
    port = relay_port if relay_port else sink_ready.get(timeout=60)
    src = socket.create_connection(("127.0.0.1", port))
    start = time.perf_counter()
    for part in stream:
        src.sendall(part)
    src.close()
    reader.join()
    results.put((done["bytes"], done["end"] - start))


def blocking_relay(listener: socket.socket, sink_port: int) -> None:
    upstream, _ = listener.accept()
    downstream = socket.create_connection(("127.0.0.1", sink_port))
    buf = bytearray(READ)
    view = memoryview(buf)
    while n := upstream.recv_into(buf):
        downstream.sendall(view[:n])
    downstream.close()
    upstream.close()


class _RawRelay(asyncio.BufferedProtocol):
    def __init__(self, downstream_factory, finished):
        self._buf = bytearray(0)
        self._make_downstream = downstream_factory
        self._finished = finished
        self.down: asyncio.Transport | None = None
        self._early: list[memoryview] = []  # read before the downstream connection was up

    def connection_made(self, transport):
        self.up = transport
        asyncio.get_running_loop().create_task(self._connect())
        transport.pause_reading()

    async def _connect(self):
        self.down, _ = await self._make_downstream(self)
        self.down.writelines(self._early)
        self._early.clear()
        self.up.resume_reading()

    def get_buffer(self, sizehint):
        # A fresh buffer per read: uvloop keeps a view of what we write until it is sent, so a buffer
        # handed to write() is never reused (allocating is cheaper than copying what was read).
        self._buf = bytearray(READ)
        return self._buf

    def buffer_updated(self, n):
        if self.down is None:  # uvloop may deliver a first read before pause_reading takes effect
            self._early.append(memoryview(self._buf)[:n])
            self.up.pause_reading()
            return
        self.down.write(memoryview(self._buf)[:n])

    def pause_writing(self):
        self.up.pause_reading()

    def resume_writing(self):
        self.up.resume_reading()

    def eof_received(self):
        self.down.close()  # flushes what is queued, then the sink's connection_lost ends the run
        return False


class _Sink(asyncio.Protocol):
    def __init__(self, relay, finished):
        self.relay = relay
        self.finished = finished

    def connection_lost(self, exc):
        self.finished.set()

    def connection_made(self, transport):
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)

    def pause_writing(self):
        self.relay.pause_writing()

    def resume_writing(self):
        self.relay.resume_writing()


async def raw_protocol_relay(sink_port: int, port_out) -> None:
    loop = asyncio.get_running_loop()
    finished = asyncio.Event()

    def downstream(relay):
        return loop.create_connection(lambda: _Sink(relay, finished), "127.0.0.1", sink_port)

    server = await loop.create_server(lambda: _RawRelay(downstream, finished), "127.0.0.1", 0)
    port_out.append(server.sockets[0].getsockname()[1])
    await finished.wait()
    server.close()


async def framed_endpoint_relay(sink_port: int, port_out) -> None:
    finished = asyncio.Event()

    async def handler(upstream):
        down = await open_endpoint("127.0.0.1", sink_port, Role.MIDDLEBOX, Role.DECODE)
        async for event in upstream:
            if isinstance(event, Hello):
                event = Hello(role=Role.MIDDLEBOX, version=WIRE_VERSION, name="relay")
            await down.send(event)  # KvChunk: payload view and verified CRC forwarded as they are
        await down.aclose()
        finished.set()

    server = await serve("127.0.0.1", 0, handler, Role.MIDDLEBOX, Role.PREFILL)
    port_out.append(server.port)
    await finished.wait()
    await server.shutdown(1.0)


def measure(kind: str, mib: int) -> tuple[int, float]:
    ctx = multiprocessing.get_context("spawn")
    sink_ready, results = ctx.Queue(), ctx.Queue()
    if kind == "blocking":
        listener = socket.create_server(("127.0.0.1", 0))
        child = ctx.Process(target=_source_and_sink, args=(listener.getsockname()[1], sink_ready, results, mib))
        child.start()
        blocking_relay(listener, sink_ready.get(timeout=60))
        listener.close()
    else:
        # The relay must listen before the source connects: start the child first (it announces the
        # sink port), start the relay, then hand the child the relay's port through the same queue.
        child = ctx.Process(target=_source_and_sink, args=(0, sink_ready, results, mib))
        child.start()
        sink_port = sink_ready.get(timeout=60)
        ports: list[int] = []
        relay = raw_protocol_relay if kind == "raw-protocol" else framed_endpoint_relay

        async def go():
            task = asyncio.create_task(relay(sink_port, ports))
            while not ports:  # noqa: ASYNC110 - the relays report their port by appending to a plain list
                await asyncio.sleep(0.001)
            sink_ready.put(ports[0])
            await task

        run(go(), loop="uvloop")
    try:
        nbytes, seconds = results.get(timeout=120)
        expected = sum(len(part) for part in frames(mib))
        if nbytes != expected:
            raise RuntimeError(f"{kind} relay delivered {nbytes} of {expected} bytes")
    finally:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()  # our own child, by its handle
            child.join()
    return nbytes, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="payload MiB to relay (default 256)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per relay; the median is reported")
    args = parser.parse_args()
    assert uvloop  # the asyncio relays run on uvloop, as agents do
    rates = {}
    for kind in ("blocking", "raw-protocol", "framed-endpoint"):
        runs = [measure(kind, args.mib) for _ in range(args.repeat)]
        rates[kind] = statistics.median(b / s for b, s in runs) / 1e9
        print(f"{kind:16s} {rates[kind]:6.2f} GB/s  (runs: "
              f"{', '.join(f'{b / s / 1e9:.2f}' for b, s in runs)}; {runs[0][0] / 1e6:.0f} MB each)", flush=True)
    for kind in ("raw-protocol", "framed-endpoint"):
        print(f"{kind} / blocking = {rates[kind] / rates['blocking']:.2f}")


if __name__ == "__main__":
    main()
