"""A small TCP relay that delays one direction with a DelayLine: the user-space delay where netem is missing.

    python -m kvtransit.shaping.relay LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT --latency 0.005

Run it inside a namespace (`ip netns exec NS ...`). Each accepted connection gets its own upstream connection
and its own DelayLine for client -> target (toxiproxy's latency toxic: each chunk carries its arrival time, so
the writer sleeps only what is still owed); target -> client is copied straight through, so one added delay
shows up once in a round trip, as netem on one egress would. Prints {"ready": true, "port": N} when listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time

from kvtransit.shaping.userspace import DelayLine

READ_BYTES = 64 * 1024
# In-flight chunks per direction before the reader stops reading: TCP back-pressure instead of unbounded memory.
MAX_QUEUED_CHUNKS = 4096
# asyncio sleeps in epoll_wait, whose timeout is rounded UP to whole milliseconds (selectors.EpollSelector), so
# a timer fires 0-1 ms late: measured +0.46 ms mean on a 5 ms delay. Sleep on the loop until this close to the
# release, then finish with time.sleep (clock_nanosleep, microsecond precision). The loop is blocked at most
# this long per release, and only when a chunk is actually due.
TIMER_SLACK_S = 0.0012


async def _pump_delayed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: DelayLine) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_QUEUED_CHUNKS)

    async def stamp() -> None:
        while data := await reader.read(READ_BYTES):
            await queue.put((line.release_time(loop.time()), data))
        await queue.put((0.0, b""))

    async def release() -> None:
        while True:
            at, data = await queue.get()
            if not data:
                break
            owed = at - loop.time()
            if owed > TIMER_SLACK_S:
                await asyncio.sleep(owed - TIMER_SLACK_S)
                owed = at - loop.time()
            if owed > 0:
                # The last TIMER_SLACK_S on purpose: the loop's timer is too coarse for a sub-ms delay line.
                time.sleep(owed)  # noqa: ASYNC251
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    await asyncio.gather(stamp(), release())


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(READ_BYTES):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


async def serve(listen_host: str, listen_port: int, target_host: str, target_port: int,
                latency_s: float, jitter_s: float = 0.0, distribution: str = "normal", seed: int = 0) -> None:
    DelayLine(latency_s, jitter_s, distribution, seed)  # bad numbers fail before we listen
    connections = 0

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        line = DelayLine(latency_s, jitter_s, distribution, seed + connections)
        target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        try:
            await asyncio.gather(_pump_delayed(client_reader, target_writer, line),
                                 _pump(target_reader, client_writer))
        except ConnectionError:
            pass  # one side hung up mid-copy: close both, the relay keeps serving others
        finally:
            for w in (target_writer, client_writer):
                w.close()

    server = await asyncio.start_server(handle, listen_host, listen_port)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"ready": True, "port": port}), flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtransit.shaping.relay")
    parser.add_argument("listen_host")
    parser.add_argument("listen_port", type=int)
    parser.add_argument("target_host")
    parser.add_argument("target_port", type=int)
    parser.add_argument("--latency", type=float, required=True, help="seconds added client -> target")
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--distribution", default="normal")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen_host, args.listen_port, args.target_host, args.target_port,
                          args.latency, args.jitter, args.distribution, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
