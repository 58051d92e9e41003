"""CRC32C over any contiguous buffer without copying it, and combining CRCs of consecutive pieces.

google_crc32c's C extension only takes buffers that need no release (bytes, numpy arrays) and rejects
bytearray and memoryview; a ctypes array laid over the same memory is accepted, so writable buffers (our
receive buffer, bytearrays) are checksummed in place. Read-only views over anything but bytes fall back to
a copy (slow path; avoid by relaying KvChunk.payload_crc).

crc32c_combine(crc(A), crc(B), len(B)) == crc(A + B) lets a KvEnd checksum over all chunk payloads reuse each
chunk's CRC instead of a second pass over the bytes (zlib's crc32_combine, for the Castagnoli polynomial).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import google_crc32c

_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected: RFC 3720 §B.4
_X0 = 1 << 31  # the polynomial "1" in reflected bit order


# The C extension's entry point; its stubs leave the result untyped (it is a Python int).
_value: Callable[[object], int] = google_crc32c.value


def crc32c(data: object) -> int:
    """CRC32C of any contiguous buffer: bytes, bytearray, memoryview, a numpy array."""
    if type(data) is bytes:
        return _value(data)
    try:
        return _value(data)  # numpy arrays and other release-free buffers
    except TypeError:
        pass
    view = memoryview(data)  # type: ignore[arg-type]  # any buffer; not one: TypeError, as before
    if view.nbytes == 0:
        return 0
    if not view.readonly:
        return _value((ctypes.c_char * view.nbytes).from_buffer(view))
    return _value(bytes(view))


def _multmodp(a: int, b: int) -> int:
    """a × b modulo the CRC polynomial (reflected bit order)."""
    m = _X0
    p = 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    table = [_X0 >> 1]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))  # x^(2^k)
    return tuple(table)


_X2N = _x2n_table()


@functools.lru_cache(maxsize=256)  # chunks of one run mostly share a few lengths
def _x8nmodp(nbytes: int) -> int:
    """x^(8·nbytes) modulo the polynomial: the operator that shifts a CRC past nbytes zero bytes."""
    p = _X0
    k = 3
    while nbytes:
        if nbytes & 1:
            p = _multmodp(_X2N[k & 31], p)
        nbytes >>= 1
        k += 1
    return p


def crc32c_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    return _multmodp(_x8nmodp(len_b), crc_a) ^ crc_b
