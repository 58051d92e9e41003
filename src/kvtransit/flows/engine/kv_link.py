"""The engine connector's KV link: a request's real KV as kvtransit wire frames, out of one engine and into another.

A serving engine (vLLM, vllm_connector.py) owns its process's main thread and calls its connector synchronously,
so each side of the link runs kvtransit's asyncio transport on a thread of its own (`LoopThread`) and the engine
only hands arrays over or picks them up:

- `KvSender` (the prefill instance): one connection to the middlebox, as a prefill agent's (Role.PREFILL); each
  request's KV goes out as KvBegin, its layers' rows in chunks of at most `MAX_CHUNK_BYTES`
  (agents/common/kv_frames.py: the token axis is never cut, so a kernel along tokens sees every token), KvEnd,
  and the middlebox's Ack (relayed from decode) or Error ends it. One request's KV at a time on the connection, as
  the middlebox expects of a prefill.
- `KvReceiver` (the decode instance): listens where the middlebox dials a decode (Role.DECODE), reassembles each
  request's stream, inverts the kernel the middlebox ran (kernels/registry.py: `decode`, by the codec
  header alone), checks the result has the engine's geometry and the prompt's tokens, keeps it until the engine
  takes it, and acks. A stream that breaks (a CRC mismatch: the wire checks every payload and the whole request;
  the sender giving up; the connection lost) is kept as a failure with its reason, never as KV: the engine fails
  that request and nothing of it reaches the engine's cache.

A request's KV here is one float32 array per layer, [2·kv_heads, tokens, head_dim]: K's heads then V's, each a
row of the whole token sequence (kv_frames.as_rows's layout). Both sides append one JSON line per request to
a record file (`record_path`), which the harness reads after the run (flows/engine/run.py): when the first token
was ready, when the stream began and ended here, its bytes raw and on the wire, and its outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from kvtransit.agents.common.kv_frames import IDENTITY_CODEC_ID, MAX_CHUNK_BYTES, byte_view, row_slices
from kvtransit.kernels.header import CODEC_IDS
from kvtransit.kernels.registry import decode as codec_decode
from kvtransit.runtime.transport import Endpoint, open_greeted, serve
from kvtransit.wire import WIRE_VERSION, clip_reason
from kvtransit.wire.errors import ErrorCode, ProtocolError, RemoteProtocolError
from kvtransit.wire.events import Ack, AckStatus, Bye, DType, Error, Hello, KvBegin, KvChunk, KvEnd, Role

log = logging.getLogger(__name__)

# Raw rows as they may cross (the connector sends float32, its cache's dtype; a bfloat16 sender is read too).
WIRE_FLOATS = {DType.F32: np.dtype(np.float32), DType.BF16: np.dtype(ml_dtypes.bfloat16)}
CODEC_NAMES = {code: name for name, code in CODEC_IDS.items()}
CONNECT_TIMEOUT_S = 30.0  # the middlebox starts after the engines (it dials decode): wait for it this long


def now_ns() -> int:
    """The shared CLOCK_MONOTONIC every kvtransit process stamps with (runtime/clock.py: MonotonicClock)."""
    return time.monotonic_ns()


@dataclass(frozen=True)
class Geometry:
    """What one request's KV must look like for this engine: layers, and each layer's rows and row width."""

    layers: int
    kv_heads: int
    head_dim: int

    @property
    def rows(self) -> int:
        return 2 * self.kv_heads

    def check(self, layers: list[np.ndarray], tokens: int) -> str | None:
        """None if `layers` is a request's KV of `tokens` tokens in this geometry, else what is wrong."""
        if len(layers) != self.layers:
            return f"{len(layers)} layers arrived, the engine has {self.layers}"
        for index, layer in enumerate(layers):
            if layer.shape != (self.rows, tokens, self.head_dim):
                return (f"layer {index} arrived as {list(layer.shape)}, the engine needs "
                        f"[{self.rows}, {tokens}, {self.head_dim}] (K and V heads, prompt tokens, head_dim)")
            if not np.isfinite(layer).all():
                return f"layer {index} holds values that are not finite"
        return None


class LoopThread:
    """An asyncio event loop on a daemon thread: the link's I/O runs there while the engine computes."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        """Cancel what still runs on the loop, stop it, join the thread and close the loop."""
        async def cancel_the_rest() -> None:
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        if self.loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                self.submit(cancel_the_rest()).result(timeout=3.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self.loop.close()


def _append_record(path: Path | None, record: dict[str, Any]) -> None:
    if path is not None:
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")


# -- the prefill side -----------------------------------------------------------------------------------------

class KvSender:
    """The prefill instance's link to the middlebox (module docstring). `send` returns at once; the frames go out
    on the link's thread, one request after another, and `outcomes` fills as the acks come back."""

    def __init__(self, host: str, port: int, *, name: str, record_path: str | None = None):
        self.host, self.port, self.name = host, port, name
        self.record_path = Path(record_path) if record_path else None
        self.outcomes: dict[int, str] = {}  # request id -> "ok" or "failed: reason"
        self._sent: dict[int, dict[str, Any]] = {}
        self._thread = LoopThread(f"{name} kv link")
        self._endpoint: Endpoint | None = None
        self._lock: asyncio.Lock | None = None
        self._reader: asyncio.Task[None] | None = None

    def send(self, request_id: int, layers: list[np.ndarray], *, prompt_tokens: int, output_tokens: int,
             first_token_ns: int) -> concurrent.futures.Future[None]:
        """Queue one request's KV (float32 [rows, tokens, head_dim] per layer) for the middlebox."""
        return self._thread.submit(self._send(request_id, layers, prompt_tokens, output_tokens, first_token_ns))

    async def _connect(self) -> Endpoint:
        if self._endpoint is not None and not self._endpoint.is_closing:
            return self._endpoint
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                endpoint = await open_greeted(self.host, self.port, Role.PREFILL, Role.MIDDLEBOX, name=self.name,
                                              timeout_s=CONNECT_TIMEOUT_S)
                break
            except OSError as exc:  # refused while the middlebox starts: dial again within the deadline
                if time.monotonic() > deadline:
                    raise ConnectionError(f"cannot reach the middlebox at {self.host}:{self.port} after "
                                          f"{CONNECT_TIMEOUT_S:.0f} s: {exc}") from exc
                await asyncio.sleep(0.2)  # housekeeping: a starting process binds its port within a few 100 ms
        self._endpoint = endpoint
        self._reader = asyncio.get_running_loop().create_task(self._read(endpoint))
        return endpoint

    async def _send(self, request_id: int, layers: list[np.ndarray], prompt_tokens: int, output_tokens: int,
                    first_token_ns: int) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one request's KV at a time on the connection
            raw_bytes = int(sum(x.nbytes for x in layers))
            record: dict[str, Any] = {"side": "prefill", "request_id": request_id, "prompt_tokens": prompt_tokens,
                                      "first_token_ns": first_token_ns, "raw_bytes": raw_bytes}
            self._sent[request_id] = record
            try:
                endpoint = await self._connect()
                rows, tokens, head_dim = layers[0].shape
                pieces = row_slices(len(layers), rows, tokens * head_dim * 4, MAX_CHUNK_BYTES)
                await endpoint.send(KvBegin(request_id=request_id, prompt_tokens=prompt_tokens,
                                            output_tokens=output_tokens, n_layers=len(layers), n_chunks=len(pieces),
                                            raw_bytes=raw_bytes, codec="none",
                                            first_token_ns=first_token_ns))
                record["begin_sent_ns"] = now_ns()
                for index, piece in enumerate(pieces):
                    block = np.ascontiguousarray(layers[piece.layer][piece.start:piece.stop], dtype=np.float32)
                    await endpoint.send(KvChunk(request_id=request_id, layer=piece.layer, chunk=index,
                                                dtype=DType.F32, shape=tuple(block.shape),
                                                codec_id=IDENTITY_CODEC_ID, codec_header=b"",
                                                payload=byte_view(block), raw_bytes=block.nbytes))
                await endpoint.send(endpoint.connection.kv_end(request_id))
                record["end_sent_ns"] = now_ns()
            except (ConnectionError, OSError, ProtocolError) as exc:
                self._finish(request_id, f"failed: the link to the middlebox failed: {exc}")

    async def _read(self, endpoint: Endpoint) -> None:
        reason = "the middlebox closed the connection"
        try:
            async for event in endpoint:
                match event:
                    case Ack():
                        ok = event.status == AckStatus.OK
                        self._finish(event.request_id, "ok" if ok else f"failed: {event.detail or 'refused'}")
                    case Error() if event.request_id is not None:
                        self._finish(event.request_id, f"failed: {event.message}")
                    case Bye():
                        break
        except (ProtocolError, ConnectionError) as exc:
            reason = f"the middlebox connection was lost: {exc}"
        finally:
            for request_id in [r for r in self._sent if r not in self.outcomes]:
                self._finish(request_id, f"failed: {reason}")
            endpoint.abort()

    def _finish(self, request_id: int, outcome: str) -> None:
        if request_id in self.outcomes:
            return
        self.outcomes[request_id] = outcome
        record = self._sent.pop(request_id, {"side": "prefill", "request_id": request_id})
        _append_record(self.record_path, {**record, "ack_ns": now_ns(), "outcome": outcome})

    def close(self) -> None:
        async def goodbye() -> None:
            if self._endpoint is not None and not self._endpoint.is_closing:
                await self._endpoint.goodbye("engine stopping")
                self._endpoint.close()
            if self._reader is not None:
                self._reader.cancel()

        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self._thread.submit(goodbye()).result(timeout=3.0)
        self._thread.stop()


# -- the decode side ------------------------------------------------------------------------------------------

@dataclass
class _Incoming:
    begin: KvBegin
    began_ns: int
    wire_bytes: int = 0
    chunks: list[tuple[int, int, DType, bytes, bytes, tuple[int, ...]]] = field(default_factory=list)


@dataclass(frozen=True)
class Arrived:
    """What the link left for one request: its KV (`layers`), or why there is none (`failure`)."""

    layers: list[np.ndarray] | None
    failure: str | None
    tokens: int


class KvReceiver:
    """The decode instance's KV ingress (module docstring): `take(request_id)` hands over what arrived."""

    def __init__(self, host: str, port: int, geometry: Geometry, *, name: str, record_path: str | None = None):
        self.geometry = geometry
        self.name = name
        self.record_path = Path(record_path) if record_path else None
        self.arrived = threading.Condition()
        self._ready: dict[int, Arrived] = {}
        self._thread = LoopThread(f"{name} kv ingress")
        self._server = self._thread.submit(serve(host, port, self._serve, Role.DECODE, Role.MIDDLEBOX)).result(10.0)
        self.port = self._server.port

    def take(self, request_id: int) -> Arrived | None:
        """What arrived for `request_id` (removed from here), or None while nothing has."""
        with self.arrived:
            return self._ready.pop(request_id, None)

    def wait(self, timeout_s: float) -> None:
        """Block up to `timeout_s` for the next arrival (an engine with nothing else to do need not spin)."""
        with self.arrived:
            self.arrived.wait(timeout_s)

    def _keep(self, request_id: int, arrived: Arrived, record: dict[str, Any]) -> None:
        with self.arrived:
            self._ready[request_id] = arrived
            self.arrived.notify_all()
        _append_record(self.record_path, record)

    async def _serve(self, endpoint: Endpoint) -> None:
        await endpoint.send(Hello(role=Role.DECODE, version=WIRE_VERSION, name=self.name))
        incoming: dict[int, _Incoming] = {}
        reason = "the kv link closed mid-stream"
        try:
            while (event := await endpoint.next_event()) is not None:
                if isinstance(event, KvBegin):
                    incoming[event.request_id] = _Incoming(event, now_ns())
                elif isinstance(event, KvChunk):
                    item = incoming[event.request_id]
                    item.wire_bytes += len(event.payload)
                    item.chunks.append((event.layer, event.codec_id, event.dtype, bytes(event.codec_header),
                                        bytes(event.payload), event.shape))
                elif isinstance(event, KvEnd):
                    item = incoming.pop(event.request_id)
                    ended_ns = now_ns()
                    arrived = await asyncio.get_running_loop().run_in_executor(None, self._invert, item)
                    self._keep(event.request_id, arrived, self._record(item, ended_ns, arrived.failure))
                    ok = arrived.failure is None
                    await endpoint.send(Ack(request_id=event.request_id,
                                            status=AckStatus.OK if ok else AckStatus.FAILED, t_ns=now_ns(),
                                            detail="" if ok else clip_reason(arrived.failure or "")))
                elif isinstance(event, Error) and event.request_id in incoming:
                    self._fail(incoming.pop(event.request_id), f"the sender gave up: {event.message}")
                elif isinstance(event, Bye):
                    break
        except RemoteProtocolError as exc:
            reason = f"the kv stream broke ({exc.code.name.lower().replace('_', ' ')}: {exc})"
            raise
        finally:
            for request_id in list(incoming):
                self._fail(incoming.pop(request_id), reason)

    def _fail(self, item: _Incoming, reason: str) -> None:
        log.warning("request %d: no KV: %s", item.begin.request_id, reason)
        self._keep(item.begin.request_id, Arrived(None, reason, item.begin.prompt_tokens),
                   self._record(item, now_ns(), reason))

    def _invert(self, item: _Incoming) -> Arrived:
        """The request's layers, the kernel inverted and the geometry checked (on a worker thread)."""
        tokens = item.begin.prompt_tokens
        by_layer: dict[int, list[np.ndarray]] = {}
        try:
            for layer, codec_id, dtype, header, payload, shape in item.chunks:
                by_layer.setdefault(layer, []).append(_rows(codec_id, dtype, header, payload, shape))
        except (ValueError, KeyError) as exc:  # KernelInputError is a ValueError: a header or payload it refused
            return Arrived(None, f"its KV does not decode: {type(exc).__name__}: {exc}", tokens)
        # A layer's chunks are runs of its rows, in order (kv_frames.row_slices): joined along the rows.
        layers = [np.concatenate(by_layer[layer], axis=0) for layer in sorted(by_layer)]
        wrong = self.geometry.check(layers, tokens)
        if wrong is not None:
            return Arrived(None, f"its KV does not fit the engine: {wrong}", tokens)
        return Arrived(layers, None, tokens)

    @staticmethod
    def _record(item: _Incoming, ended_ns: int, failure: str | None) -> dict[str, Any]:
        codecs = sorted({CODEC_NAMES.get(c[1], str(c[1])) for c in item.chunks})
        return {"side": "decode", "request_id": item.begin.request_id, "prompt_tokens": item.begin.prompt_tokens,
                "first_token_ns": item.begin.first_token_ns, "began_ns": item.began_ns, "ended_ns": ended_ns,
                "raw_bytes": item.begin.raw_bytes, "wire_bytes": item.wire_bytes, "codecs": codecs,
                "outcome": "ok" if failure is None else f"failed: {failure}"}

    def close(self) -> None:
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self._thread.submit(self._server.shutdown(1.0)).result(timeout=3.0)
        self._thread.stop()


def _rows(codec_id: int, dtype: DType, header: bytes, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """One chunk's rows as float32: the raw rows in their wire dtype, or the codec's inverse from its header."""
    if codec_id == IDENTITY_CODEC_ID:
        if dtype not in WIRE_FLOATS:
            taken = ", ".join(d.name for d in WIRE_FLOATS)
            raise ValueError(f"raw rows of dtype {dtype.name}: the engine takes {taken}")
        return np.frombuffer(payload, dtype=WIRE_FLOATS[dtype]).reshape(shape).astype(np.float32)
    return np.asarray(codec_decode(header, payload), dtype=np.float32)


__all__ = ["Arrived", "ErrorCode", "Geometry", "KvReceiver", "KvSender", "LoopThread"]
