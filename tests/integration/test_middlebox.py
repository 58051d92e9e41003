"""The middlebox on loopback: KV of known content in, the kernel's output out, outcomes for every request.

The peers here are small wire clients/servers written for the test (a prefill that sends known KV, a
decode that collects frames and acks), so each test can pin one behaviour of the middlebox itself; the
serving-loop tests run it between the real agents.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kvtransit.agents.common.kv_frames import as_rows, byte_view, row_slices
from kvtransit.agents.middlebox import Middlebox
from kvtransit.agents.middlebox.control import register_control_routes
from kvtransit.kernels import decode as decode_codec
from kvtransit.kernels import get_codec
from kvtransit.model.scenario import Scenario
from kvtransit.runtime.http import HttpServer
from kvtransit.runtime.transport import open_endpoint, serve
from kvtransit.wire import WIRE_VERSION, ErrorCode
from kvtransit.wire.events import Ack, AckStatus, DType, Error, Hello, KvBegin, KvChunk, KvEnd, Role
from kvtransit.wire.limits import MAX_MESSAGE, MAX_REASON

BF16 = np.dtype(ml_dtypes.bfloat16)
LAYERS, HEADS, TOKENS, HEAD_DIM = 4, 2, 256, 16


def known_kv(seed: int) -> np.ndarray:
    """[layers, 2, heads, tokens, head_dim] white noise in BF16: band-keep's error on it is known."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((LAYERS, 2, HEADS, TOKENS, HEAD_DIM), dtype=np.float32).astype(BF16)


def scenario(**overrides) -> Scenario:
    # A fast link (1 GB/s shaped) so tests spend their time on behaviour, not on waiting.
    base = dict(codec="freq-keep-k", keep=0.5, block=64, sinks=4, variant="dct", scale=1.0, link="eth-25g",
                dilation=3.125)
    base.update(overrides)
    return Scenario.build(**base)


@dataclass
class DecodeStub:
    """Collects each request's frames and acks on KvEnd (or refuses, when told to)."""

    refuse: set = field(default_factory=set)
    fail_with: dict = field(default_factory=dict)  # request id → the message of an Error naming it, at KvEnd
    begins: dict = field(default_factory=dict)
    chunks: dict = field(default_factory=dict)
    ends: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    server: object = None

    async def handle(self, endpoint):
        await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name="decode-stub"))
        async for event in endpoint:
            if isinstance(event, KvBegin):
                self.begins[event.request_id] = event
                self.chunks[event.request_id] = []
            elif isinstance(event, KvChunk):
                self.chunks[event.request_id].append((event.codec_header, bytes(event.payload), event.shape))
            elif isinstance(event, KvEnd):
                self.ends[event.request_id] = event
                if event.request_id in self.fail_with:
                    await endpoint.send(Error(code=ErrorCode.REQUEST_FAILED, request_id=event.request_id,
                                              message=self.fail_with.pop(event.request_id)))
                    continue
                status = AckStatus.FAILED if event.request_id in self.refuse else AckStatus.OK
                await endpoint.send(Ack(request_id=event.request_id, status=status, detail="stub"))
            elif isinstance(event, Error):
                self.errors.append(event)

    def reassemble(self, rid: int) -> np.ndarray:
        rows = [decode_codec(h, p) if h else np.frombuffer(p, BF16).reshape(shape) for h, p, shape in self.chunks[rid]]
        return np.concatenate(rows).reshape(LAYERS, 2, HEADS, TOKENS, HEAD_DIM)


async def send_kv(endpoint, rid: int, kv: np.ndarray, *, stop_after: int | None = None,
                  first_token_ns: int = 0) -> None:
    """`first_token_ns`: the stamp the middlebox holds the hand-off until (0: none, it goes on arrival)."""
    pieces = row_slices(LAYERS, 2 * HEADS, TOKENS * HEAD_DIM * 2, max_chunk_bytes=TOKENS * HEAD_DIM * 2 * 2)
    await endpoint.send(KvBegin(request_id=rid, prompt_tokens=TOKENS, output_tokens=8, n_layers=LAYERS,
                                n_chunks=len(pieces), raw_bytes=kv.nbytes, codec="none",
                                first_token_ns=first_token_ns))
    for index, piece in enumerate(pieces):
        if stop_after is not None and index == stop_after:
            return
        block = as_rows(kv[piece.layer])[piece.start:piece.stop]
        await endpoint.send(KvChunk(request_id=rid, layer=piece.layer, chunk=index, dtype=DType.BF16,
                                    shape=tuple(block.shape), codec_id=0, codec_header=b"",
                                    payload=byte_view(block), raw_bytes=block.nbytes))
    await endpoint.send(endpoint.connection.kv_end(rid))


async def prefill_client(port: int):
    endpoint = await open_endpoint("127.0.0.1", port, Role.PREFILL, Role.MIDDLEBOX)
    await endpoint.send(Hello(role=Role.PREFILL, version=WIRE_VERSION, name="prefill-stub"))
    hello = await endpoint.next_event()
    assert isinstance(hello, Hello) and hello.role == Role.MIDDLEBOX
    return endpoint


async def next_acks(endpoint, n: int) -> dict[int, Ack]:
    acks = {}
    while len(acks) < n:
        event = await asyncio.wait_for(endpoint.next_event(), 10)
        assert isinstance(event, Ack), event
        acks[event.request_id] = event
    return acks


@pytest.fixture
async def testbed():
    """A decode stub, an in-process Middlebox connected to it, and its prefill-facing server."""
    made = []

    async def make(**overrides):
        stub = DecodeStub()
        stub.server = await serve("127.0.0.1", 0, stub.handle, Role.DECODE, Role.MIDDLEBOX)
        registry = CollectorRegistry()
        try:
            mb = Middlebox(scenario(**overrides), [("127.0.0.1", stub.server.port)], registry=registry)
        except Exception:
            await stub.server.shutdown(1.0)  # a refused scenario must not leave the stub's socket open
            raise
        await mb.connect_decodes(timeout_s=5)
        server = await serve("127.0.0.1", 0, mb.handle_prefill, Role.MIDDLEBOX, Role.PREFILL)
        made.append((stub, mb, server))
        return stub, mb, server, registry

    yield make
    for stub, mb, server in made:
        await server.shutdown(1.0)
        await mb.close()
        await stub.server.shutdown(1.0)


async def test_band_keep_runs_on_every_chunk_and_decode_gets_the_kernels_output(testbed):
    stub, _mb, server, registry = await testbed()
    kv = known_kv(1)
    client = await prefill_client(server.port)
    await send_kv(client, 11, kv)
    acks = await next_acks(client, 1)
    assert acks[11].status == AckStatus.OK
    assert stub.begins[11].codec == "freq-keep-k"
    # Exactly the kernel's output: the same codec applied here gives the same bytes.
    codec = get_codec("freq-keep-k", keep=0.5, block=64, sinks=4, variant="dct")
    first_rows = as_rows(kv[0])[0:2]
    assert stub.chunks[11][0][1] == codec.encode(first_rows).payload.tobytes()
    # Error on white noise: sqrt(1 - kept/N) with 4 exact sinks (docs/reference.md §6 sanity check), ≈ 0.70.
    out = stub.reassemble(11).astype(np.float32)
    ref = kv.astype(np.float32)
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert 0.6 < rel < 0.72
    wire = sum(len(p) for _, p, _ in stub.chunks[11])
    assert wire < 0.6 * kv.nbytes  # keep half, plus sinks and headers
    assert registry.get_sample_value("kvtransit_middlebox_kv_in_bytes_total",
                                     {"link": "eth-25g", "codec": "none"}) == kv.nbytes
    assert registry.get_sample_value("kvtransit_middlebox_kv_wire_bytes_total",
                                     {"link": "eth-25g", "codec": "freq-keep-k"}) == wire
    assert registry.get_sample_value("kvtransit_middlebox_requests_total", {"outcome": "ok"}) == 1
    await client.aclose()


async def test_pass_through_forwards_the_bytes_unchanged(testbed):
    stub, _mb, server, _ = await testbed(codec="none")
    kv = known_kv(2)
    client = await prefill_client(server.port)
    await send_kv(client, 5, kv)
    assert (await next_acks(client, 1))[5].status == AckStatus.OK
    assert stub.begins[5].codec == "none"
    assert np.array_equal(stub.reassemble(5).view(np.uint16), kv.view(np.uint16))
    await client.aclose()


async def test_decode_refusal_reaches_the_prefill_as_a_failed_ack_and_is_counted(testbed):
    stub, _mb, server, registry = await testbed()
    stub.refuse.add(8)
    client = await prefill_client(server.port)
    await send_kv(client, 7, known_kv(3))
    await send_kv(client, 8, known_kv(4))
    acks = await next_acks(client, 2)
    assert acks[7].status == AckStatus.OK and acks[8].status == AckStatus.FAILED
    assert registry.get_sample_value("kvtransit_middlebox_requests_total", {"outcome": "failed"}) == 1
    await client.aclose()


async def test_a_prefill_that_dies_mid_request_fails_that_request_only(testbed):
    stub, mb, server, registry = await testbed()
    dying = await prefill_client(server.port)
    await send_kv(dying, 21, known_kv(5), stop_after=3)
    await asyncio.sleep(0.1)
    dying.abort()
    healthy = await prefill_client(server.port)
    await send_kv(healthy, 22, known_kv(6))
    assert (await next_acks(healthy, 1))[22].status == AckStatus.OK
    for _ in range(100):
        if stub.errors:
            break
        await asyncio.sleep(0.05)
    # Decode was told the stream for 21 is abandoned, with the reason; 21 never completed.
    assert [e.request_id for e in stub.errors] == [21]
    assert "prefill" in stub.errors[0].message
    assert 21 not in stub.ends and 22 in stub.ends
    assert registry.get_sample_value("kvtransit_middlebox_requests_total", {"outcome": "failed"}) == 1
    assert mb.stats()["open_handoffs"] == 0
    await healthy.aclose()


# 341 CJK characters: 1,023 UTF-8 bytes, a legal Error message on its own (MAX_MESSAGE is 1,024 bytes), but
# not once the middlebox puts "decode-0: " in front of it. A character slice ([:1000]) let that through and the
# send failed with LocalProtocolError, killing the connection; the wire's clip helpers cut at the byte limit.
LONG_NON_ASCII = "接" * 341


async def test_a_long_non_ascii_decode_failure_reaches_the_prefill_clipped_and_both_connections_carry_on(testbed):
    stub, _mb, server, registry = await testbed()
    stub.fail_with[61] = LONG_NON_ASCII
    client = await prefill_client(server.port)
    await send_kv(client, 61, known_kv(10))
    error = await asyncio.wait_for(client.next_event(), 10)
    assert isinstance(error, Error) and error.request_id == 61, error
    assert error.message.startswith("decode-0: 接接")
    assert len(error.message.encode()) <= MAX_MESSAGE and error.message.count("接") >= 300
    # The same prefill connection, the same decode connection: the next hand-off goes through.
    await send_kv(client, 62, known_kv(11))
    assert (await next_acks(client, 1))[62].status == AckStatus.OK
    assert registry.get_sample_value("kvtransit_middlebox_requests_total", {"outcome": "failed"}) == 1
    assert registry.get_sample_value("kvtransit_middlebox_requests_total", {"outcome": "ok"}) == 1
    await client.aclose()


async def test_a_prefill_giving_up_with_a_long_non_ascii_reason_is_passed_on_clipped_both_ways(testbed):
    stub, _mb, server, _ = await testbed()
    client = await prefill_client(server.port)
    await send_kv(client, 63, known_kv(12), stop_after=2)
    await client.send(Error(code=ErrorCode.REQUEST_FAILED, message="é" * 500, request_id=63))  # 1,000 bytes
    for _ in range(200):
        if stub.errors:
            break
        await asyncio.sleep(0.02)
    [error] = stub.errors
    assert error.request_id == 63 and error.message.startswith("prefill gave up: éé")
    assert len(error.message.encode()) <= MAX_MESSAGE and error.message.count("é") >= 300
    await send_kv(client, 64, known_kv(13))
    acks = await next_acks(client, 2)
    # The prefill is told its abandoned hand-off is over, in a FAILED Ack whose detail fits MAX_REASON.
    assert acks[63].status == AckStatus.FAILED and acks[63].detail.startswith("prefill gave up: éé")
    assert len(acks[63].detail.encode()) <= MAX_REASON
    assert acks[64].status == AckStatus.OK
    assert 63 not in stub.ends and 64 in stub.ends
    await client.aclose()


async def test_a_kernel_the_module_cannot_run_is_refused_by_policy(testbed):
    from kvtransit.model.errors import ConfigError

    with pytest.raises(ConfigError, match="rounding"):
        await testbed(codec="fp8", policy="reject")
    _stub, mb, _server, _ = await testbed(codec="fp8", policy="host")
    assert mb.kernel.runs_on == "host"


async def test_the_module_spends_no_energy_when_the_kernel_runs_on_the_host(testbed):
    """--policy host: fp8 needs rounding, which the module does not publish, so it runs on the host; the
    middlebox's module energy counter (what the run report reads) stays at zero while the bytes still cross."""
    for codec, policy, spends in (("fp8", "host", False), ("freq-keep-k", "reject", True)):
        _stub, mb, server, _ = await testbed(codec=codec, policy=policy)
        client = await prefill_client(server.port)
        await send_kv(client, 21, known_kv(3))
        assert (await next_acks(client, 1))[21].status == AckStatus.OK
        stats = mb.stats()
        assert stats["wire_bytes"] > 0 and stats["link_energy_j"] > 0
        assert (stats["module_energy_j"] > 0) is spends, (codec, policy, stats["module_energy_j"])
        await client.aclose()


async def test_control_api_reads_and_changes_the_chain_live(testbed):
    stub, mb, server, _ = await testbed()
    http = HttpServer()
    register_control_routes(http, mb)
    await http.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{http.port}"

    def call(method, path, body=None):
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(base + path, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            with err:  # an HTTPError holds the response's socket until closed (a ResourceWarning otherwise)
                return err.code, json.loads(err.read())

    try:
        status, chain = await asyncio.to_thread(call, "GET", "/chain")
        assert status == 200 and [s["stage"] for s in chain] == ["kernel", "module", "link"]
        status, chain = await asyncio.to_thread(call, "PUT", "/kernel", {"codec": "none"})
        assert status == 200 and chain[0]["codec"] == "none"
        status, body = await asyncio.to_thread(call, "PUT", "/kernel", {"codec": "zstd"})
        assert status == 400 and "zstd" in body["error"] and "freq-keep-k" in body["error"]
        status, body = await asyncio.to_thread(call, "PUT", "/kernel", b"{not json")
        assert status == 400 and "JSON" in body["error"]
        status, body = await asyncio.to_thread(call, "PUT", "/link", {"rate_Bps": -5})
        assert status == 400 and "rate_Bps" in body["error"]
        status, chain = await asyncio.to_thread(call, "PUT", "/link", {"rate_Bps": 5e8, "latency_s": 0.002})
        assert status == 200 and chain[2]["rate_Bps"] == 5e8 and chain[2]["latency_s"] == pytest.approx(0.002)
        # The chain is unchanged after a refused call; the kernel change applies to the next hand-off.
        assert mb.kernel.name == "none"
        client = await prefill_client(server.port)
        await send_kv(client, 31, known_kv(7))
        await next_acks(client, 1)
        assert stub.begins[31].codec == "none"
        await client.aclose()
    finally:
        await http.close()


def test_middlebox_process_relays_and_exports_metrics(tmp_path):
    """The real process: `kvtransit middlebox`, its readiness line, its /metrics."""

    async def scenario_run():
        stub = DecodeStub()
        stub.server = await serve("127.0.0.1", 0, stub.handle, Role.DECODE, Role.MIDDLEBOX)
        argv = [sys.executable, "-m", "kvtransit.cli", "middlebox", "--decode", f"127.0.0.1:{stub.server.port}",
                "--codec", "freq-keep-k", "--scale", "1", "--dilation", "3.125"]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            ready = json.loads(line.removeprefix("KVTRANSIT-READY "))
            assert ready["role"] == "middlebox"
            client = await prefill_client(ready["listen_port"])
            await send_kv(client, 41, known_kv(8))
            assert (await next_acks(client, 1))[41].status == AckStatus.OK
            await client.aclose()
            metrics = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{ready['metrics_port']}/metrics").read().decode())
            assert re.search(r'kvtransit_middlebox_requests_total\{outcome="ok"\} 1\.0', metrics)
            assert "kvtransit_link_configured_rate_bytes_per_second" in metrics
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
            await stub.server.shutdown(1.0)

    asyncio.run(scenario_run())


async def test_a_transit_bound_kernel_holds_the_link_for_its_modelled_compute_time(testbed):
    """FFT length 64 with the transform charged costs 7.5 ops/B against the simulator's 1.6 ops per line
    byte (docs/reference.md §5): the hand-off takes ops / (1.6 x bw), not wire / bw, and is counted transit-bound."""
    import time as _time

    from kvtransit.model.module.budget import fft_ops_per_byte

    # 3.125 MB/s shaped (eth-25g at scale 1, dilation 1000): the hold (~0.2 s) dwarfs the fixed overheads.
    stub, mb, server, registry = await testbed(dilation=1000.0)
    mb.reconfigure("kernel", {"codec": "freq-keep-k", "keep": 0.5, "block": 64, "sinks": 4, "transform_charged": True})
    assert mb.kernel.budget.verdict.value == "transit-bound"
    kv = known_kv(9)
    rate = mb.chain.link.link.bandwidth_Bps
    compute_s = kv.nbytes * fft_ops_per_byte(64) / (1.6 * rate)
    wire_s = 0.51 * kv.nbytes / rate
    assert compute_s > 3 * wire_s
    client = await prefill_client(server.port)
    start = _time.monotonic()
    await send_kv(client, 51, kv)
    assert (await next_acks(client, 1))[51].status == AckStatus.OK
    took = _time.monotonic() - start
    assert took == pytest.approx(compute_s, rel=0.25), (took, compute_s, wire_s)
    frames = len(stub.chunks[51])
    assert registry.get_sample_value("kvtransit_module_transit_bound_total",
                                     {"link": "eth-25g", "codec": "freq-keep-k"}) == frames
    modelled = registry.get_sample_value("kvtransit_module_modelled_compute_seconds_total",
                                         {"link": "eth-25g", "codec": "freq-keep-k"})
    assert modelled == pytest.approx(compute_s / 1000.0, rel=1e-6)  # reported in model seconds
    await client.aclose()
