"""The vLLM connector's KV ingress (flows/engine/kv_link.py: KvReceiver) against a middlebox's frames over loopback
TCP: a kernel's output inverted to the engine's geometry, and every way a hand-off can go wrong kept as a failure
with its reason, never as KV. No process: the receiver runs on a thread of this one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kvtransit.agents.common.kv_frames import IDENTITY_CODEC_ID, byte_view, codec_id, transit_codec
from kvtransit.flows.engine.kv_link import Geometry, KvReceiver
from kvtransit.runtime.transport import open_greeted
from kvtransit.wire.events import Ack, AckStatus, DType, KvBegin, KvChunk, Role

GEOMETRY = Geometry(layers=2, kv_heads=3, head_dim=64)
TOKENS = 96


def _layers(seed: int, tokens: int = TOKENS) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((GEOMETRY.rows, tokens, GEOMETRY.head_dim)).astype(np.float32)
            for _ in range(GEOMETRY.layers)]


def _chunk(request_id: int, layer: int, rows: np.ndarray, codec: str) -> KvChunk:
    if codec == "none":
        return KvChunk(request_id=request_id, layer=layer, chunk=layer, dtype=DType.F32, shape=rows.shape,
                       codec_id=IDENTITY_CODEC_ID, codec_header=b"", payload=byte_view(rows), raw_bytes=rows.nbytes)
    encoded = transit_codec(codec, keep=0.5, block=32, sinks=4, variant="dct", precision_bits=None).encode(rows)
    return KvChunk(request_id=request_id, layer=layer, chunk=layer, dtype=DType.F32, shape=rows.shape,
                   codec_id=codec_id(codec), codec_header=encoded.header, payload=byte_view(encoded.payload),
                   raw_bytes=rows.nbytes)


async def _hand_off(port: int, request_id: int, layers: list[np.ndarray], codec: str, *, tokens: int = TOKENS,
                    corrupt: bool = False) -> object:
    """Send one request's KV as the middlebox does; the answer decode gave (None if it dropped the connection)."""
    endpoint = await open_greeted("127.0.0.1", port, Role.MIDDLEBOX, Role.DECODE, name="test", timeout_s=5.0)
    raw = sum(x.nbytes for x in layers)
    await endpoint.send(KvBegin(request_id=request_id, prompt_tokens=tokens, output_tokens=4,
                                n_layers=len(layers), n_chunks=len(layers), raw_bytes=raw, codec="none",
                                first_token_ns=1))
    for layer, rows in enumerate(layers):
        chunk = _chunk(request_id, layer, rows, codec)
        if corrupt:  # a bit flipped after the CRC was computed, as the middlebox's corrupt fault does
            parts = list(endpoint.connection.send_parts(chunk))
            payload = bytearray(parts[-1])
            payload[0] ^= 1
            await endpoint.write_parts([*parts[:-1], bytes(payload)])
        else:
            await endpoint.send(chunk)
    if not corrupt:
        await endpoint.send(endpoint.connection.kv_end(request_id))
    try:
        async with asyncio.timeout(10.0):
            answer = await endpoint.next_event()
    except Exception:  # the receiver dropped the connection: what it kept says why
        answer = None
    endpoint.abort()
    return answer


@pytest.fixture
def receiver():
    r = KvReceiver("127.0.0.1", 0, GEOMETRY, name="test-decode")
    yield r
    r.close()


def _taken(receiver: KvReceiver, request_id: int):
    for _ in range(200):
        arrived = receiver.take(request_id)
        if arrived is not None:
            return arrived
        receiver.wait(0.05)
    raise AssertionError(f"nothing arrived for request {request_id}")


async def test_raw_float32_kv_arrives_bit_for_bit_and_is_acked(receiver):
    layers = _layers(1)
    answer = await _hand_off(receiver.port, 7, layers, "none")
    assert isinstance(answer, Ack) and answer.status == AckStatus.OK
    arrived = _taken(receiver, 7)
    assert arrived.failure is None
    for got, sent in zip(arrived.layers, layers, strict=True):
        np.testing.assert_array_equal(got, sent)


async def test_band_keep_output_is_inverted_to_the_engines_geometry(receiver):
    layers = _layers(2)
    answer = await _hand_off(receiver.port, 8, layers, "freq-keep-k")
    assert isinstance(answer, Ack) and answer.status == AckStatus.OK
    arrived = _taken(receiver, 8)
    assert arrived.failure is None
    for got, sent in zip(arrived.layers, layers, strict=True):
        assert got.shape == sent.shape and got.dtype == np.float32
        assert not np.array_equal(got, sent)  # lossy: half the band kept
        assert np.isfinite(got).all()


async def test_kv_of_the_wrong_geometry_is_refused_with_the_shape_and_never_kept(receiver):
    layers = _layers(3)[:1]  # one layer where the engine has two
    answer = await _hand_off(receiver.port, 9, layers, "none")
    assert isinstance(answer, Ack) and answer.status == AckStatus.FAILED
    assert "1 layers arrived, the engine has 2" in answer.detail
    arrived = _taken(receiver, 9)
    assert arrived.layers is None and "the engine has 2" in arrived.failure


async def test_a_corrupted_chunk_fails_its_request_with_the_crc_reason(receiver):
    await _hand_off(receiver.port, 10, _layers(4), "none", corrupt=True)
    arrived = _taken(receiver, 10)
    assert arrived.layers is None
    assert "payload crc mismatch" in arrived.failure
