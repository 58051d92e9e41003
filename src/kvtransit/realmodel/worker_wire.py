"""What an agent and its real-model worker say to each other (agents/common/model_worker.py ↔ live_worker.py),
without pickle (tests/unit/test_security_basics.py: nothing here unpickles data, even from our own child).

A message is JSON-able data in which `bytes` and numpy arrays may appear anywhere: `pack` puts each of them in a
buffer of its own, after a JSON header that says where each goes back, its byte count and, for an array, its dtype
(from ALLOWED_DTYPES) and shape. On the pipe a message is its length (8 bytes, big-endian), then the packed bytes
(`frame`). Tuples come back as lists, dataclasses (a texts.Window) as dicts of their fields.
"""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from typing import Any

import numpy as np
from ml_dtypes import bfloat16

from kvtransit.realmodel.errors import RealModelError

LENGTH_BYTES = 8
ALLOWED_DTYPES: dict[str, Any] = {"bfloat16": bfloat16, "float32": np.float32, "float64": np.float64,
                                  "uint8": np.uint8, "int64": np.int64}
_HEADER_BYTES = 8
_BUFFER = "__buffer__"


def pack(message: Any) -> bytes:
    buffers: list[bytes] = []
    described: list[dict[str, Any]] = []

    def walk(value: Any) -> Any:
        if isinstance(value, bytes | bytearray | memoryview):
            raw = bytes(value)
            described.append({"kind": "bytes", "nbytes": len(raw)})
            buffers.append(raw)
            return {_BUFFER: len(buffers) - 1}
        if isinstance(value, np.ndarray):
            name = str(value.dtype)
            if name not in ALLOWED_DTYPES:
                raise RealModelError(f"worker wire: arrays of {name} are not carried ({', '.join(ALLOWED_DTYPES)})")
            raw = np.ascontiguousarray(value).tobytes()
            described.append({"kind": "array", "nbytes": len(raw), "dtype": name, "shape": list(value.shape)})
            buffers.append(raw)
            return {_BUFFER: len(buffers) - 1}
        if is_dataclass(value) and not isinstance(value, type):
            return walk(asdict(value))
        if isinstance(value, dict):
            return {str(k): walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        if isinstance(value, np.generic):
            return value.item()
        return value

    header = json.dumps({"message": walk(message), "buffers": described}).encode()
    return len(header).to_bytes(_HEADER_BYTES, "big") + header + b"".join(buffers)


def frame(message: Any) -> bytes:
    """The message as it goes on the pipe: its packed length, then `pack`'s bytes."""
    data = pack(message)
    return len(data).to_bytes(LENGTH_BYTES, "big") + data


def unpack(data: bytes) -> Any:
    view = memoryview(data)
    size = int.from_bytes(view[:_HEADER_BYTES], "big")
    header = json.loads(bytes(view[_HEADER_BYTES:_HEADER_BYTES + size]))
    offset = _HEADER_BYTES + size
    values: list[Any] = []
    for buffer in header["buffers"]:
        raw = bytes(view[offset:offset + buffer["nbytes"]])
        offset += buffer["nbytes"]
        if buffer["kind"] == "bytes":
            values.append(raw)
        else:
            dtype = ALLOWED_DTYPES.get(buffer["dtype"])
            if dtype is None:
                raise RealModelError(f"worker wire: arrays of {buffer['dtype']} are not carried")
            values.append(np.frombuffer(raw, dtype=dtype).reshape(buffer["shape"]))
    if offset != len(data):
        raise RealModelError(f"worker wire: {len(data) - offset} bytes past the message's last buffer")

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {_BUFFER}:
                return values[value[_BUFFER]]
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(header["message"])
