"""Shared by the transport tests (h11's tests/helpers.py, for our Endpoints): events to send, a connected pair
with a KV stream open, and copies of received payloads (a payload view is only valid until the next receive).
"""

from __future__ import annotations

import dataclasses

from kvtransit.runtime.transport import FlowLimits, memory_pair
from kvtransit.wire import Role
from kvtransit.wire.events import DType, Hello, KvBegin, KvChunk
from kvtransit.wire.limits import WIRE_VERSION


def hello(role: Role, name: str | None = None) -> Hello:
    return Hello(role=role, version=WIRE_VERSION, name=name or f"{role.name.lower()}-test")


def kv_begin(request_id: int, raw_bytes: int, n_chunks: int = 1) -> KvBegin:
    return KvBegin(request_id=request_id, prompt_tokens=1, output_tokens=1, n_layers=n_chunks, n_chunks=n_chunks,
                   raw_bytes=raw_bytes, codec="none", first_token_ns=0)


def kv_chunk(request_id: int, index: int, payload) -> KvChunk:
    """Chunk `index` of a stream of raw bytes (layer = chunk = index), carrying `payload` as given."""
    return KvChunk(request_id=request_id, layer=index, chunk=index, dtype=DType.U8, shape=(len(payload),),
                   codec_id=0, codec_header=b"", payload=payload, raw_bytes=len(payload))


def owned(event):
    """Copy a received payload view so the event may be kept past the next receive."""
    if isinstance(getattr(event, "payload", None), memoryview):
        return dataclasses.replace(event, payload=bytes(event.payload))
    return event


async def collect(endpoint) -> list:
    """Every event until the peer closes, payloads copied."""
    return [owned(event) async for event in endpoint]


async def kv_stream_pair(request_id: int, n_chunks: int, chunk_bytes: int, limits: FlowLimits | None = None):
    """A prefill → middlebox pair in memory with Hello and KvBegin already across: ready for KvChunks."""
    sender, receiver = memory_pair(Role.PREFILL, Role.MIDDLEBOX, limits=limits or FlowLimits())
    await sender.send(hello(Role.PREFILL))
    await sender.send(kv_begin(request_id, n_chunks * chunk_bytes, n_chunks))
    assert isinstance(await receiver.next_event(), Hello)
    assert isinstance(await receiver.next_event(), KvBegin)
    return sender, receiver
