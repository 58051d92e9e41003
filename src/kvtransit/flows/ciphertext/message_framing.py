"""The framing of the ciphertext flows' messages on their emulated link: a kind byte and a 4-byte big-endian
length, then the payload. Reading checks the kind is one expected here and the length is the one that kind
must have (ML-KEM's sizes are fixed by FIPS 203), so a wrong or truncated message is a one-line error.
"""

from __future__ import annotations

import asyncio
import struct

_HEADER = struct.Struct(">BI")
HEADER_BYTES = _HEADER.size  # 5: what each message adds to the link (flows/ciphertext/model.py)
# A ciphertext of the FHE flow is a few MB at most (CKKS N = 8192, 4 moduli: ~0.4 MB); anything larger is refused
# before it is allocated.
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024


class MessageError(ValueError):
    """A message on a ciphertext link was not what the protocol expects (one line, says what and where)."""


def frame(kind: int, payload: bytes) -> bytes:
    if not 0 <= kind <= 255:
        raise MessageError(f"message kind must be 0..255, got {kind}")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MessageError(f"message of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    return _HEADER.pack(kind, len(payload)) + payload


async def read_message(reader: asyncio.StreamReader, expected: dict[int, int | None], where: str) -> tuple[int, bytes]:
    """The next message; `expected` maps each acceptable kind to its exact length (None: any length)."""
    try:
        kind, length = _HEADER.unpack(await reader.readexactly(HEADER_BYTES))
    except asyncio.IncompleteReadError as exc:
        raise MessageError(f"{where}: the link closed after {len(exc.partial)} of a {HEADER_BYTES}-byte header") \
            from None
    if kind not in expected:
        raise MessageError(f"{where}: unexpected message kind {kind} (expected {sorted(expected)})")
    size = expected[kind]
    if (size is not None and length != size) or length > MAX_PAYLOAD_BYTES:
        raise MessageError(f"{where}: message kind {kind} of {length} bytes, expected {size}")
    try:
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise MessageError(f"{where}: the link closed after {len(exc.partial)} of {length} payload bytes") from None
