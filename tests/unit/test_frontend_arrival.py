"""Where the front end's TTFT starts (agents/frontend/serving.py): a request's arrival, handed to the testbed, is when
its first byte reached the front end, so receiving its body, parsing and tokenizing it count in its TTFT, as they
do in vLLM's and in a load tool's. The front end's connections are persistent, so a tool reuses one."""

from __future__ import annotations

import asyncio
import json

from kvtransit.agents.frontend.openai_protocol import Limits
from kvtransit.agents.frontend.prompt_tokens import ByteEstimate
from kvtransit.agents.frontend.serving import OpenAIServer, RunOver

GENEROUS_S = 10.0  # bounds a hang; times nothing
MODEL = "test-model"


class SteppedClock:
    """The testbed's clock, moved by hand (the test) and by tokenizing (TimedTokenizer)."""

    timer = "manual"

    def __init__(self) -> None:
        self.now = 1_000_000
        self.read = asyncio.Event()  # set when it is read: the front end reads it as a request's bytes come in

    def now_ns(self) -> int:
        self.read.set()
        return self.now

    async def sleep_until(self, deadline_ns: int) -> int:
        raise AssertionError("the front end does not sleep on the testbed's clock")


class TimedTokenizer(ByteEstimate):
    """Counting a prompt takes 3 ms of the testbed's clock."""

    def __init__(self, clock: SteppedClock):
        self.clock = clock

    def text(self, text: str) -> int:
        self.clock.now += 3_000_000
        return super().text(text)


class RecordingTestbed:
    """The testbed seen from the HTTP side (serving.Testbed): records what it was handed, takes nothing."""

    def __init__(self) -> None:
        self.clock = SteppedClock()
        self.submitted: list[tuple[int, int, int]] = []

    async def submit(self, prompt_tokens: int, output_tokens: int, arrival_ns: int):
        self.submitted.append((prompt_tokens, output_tokens, arrival_ns))
        raise RunOver("the test takes no requests")

    def cancel(self, request_id: int) -> None:
        raise AssertionError("nothing was admitted")


async def test_a_requests_arrival_is_its_first_byte_so_body_parsing_and_tokenizing_count_in_ttft():
    testbed = RecordingTestbed()
    server = OpenAIServer(testbed, TimedTokenizer(testbed.clock), Limits((MODEL,), 4096), name="t")
    await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        first_byte_ns = testbed.clock.now
        for n in (1, 2):  # two requests on one connection: each is stamped with its own first byte
            body = json.dumps({"model": MODEL, "prompt": "x" * 400, "max_tokens": 8}).encode()
            request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            testbed.clock.read.clear()
            writer.write(request[:30])  # the request line's start
            await writer.drain()
            await asyncio.wait_for(testbed.clock.read.wait(), GENEROUS_S)  # the front end has read it
            testbed.clock.now += 7_000_000  # the rest of the request takes 7 ms to come
            writer.write(request[30:])
            status_line = await asyncio.wait_for(reader.readline(), GENEROUS_S)
            assert status_line.startswith(b"HTTP/1.1 503 "), status_line
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                assert not line.lower().startswith(b"connection: close"), "the connection is kept for the next"
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            assert testbed.submitted[-1] == (100, 8, first_byte_ns), f"request {n}"
            # Tokenizing ran after the arrival (3 ms) and the body's 7 ms were before it was whole.
            assert testbed.clock.now == first_byte_ns + 10_000_000
            first_byte_ns = testbed.clock.now
        writer.close()
    finally:
        await server.close()
