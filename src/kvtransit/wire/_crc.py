"""CRC32C over any contiguous buffer without copying it, and combining CRCs of consecutive pieces.

The `crc32c` package (ICRAR, hardware-accelerated: 25-28 GB/s on this box, the speed of google_crc32c) takes
any buffer (bytes, bytearray, memoryview, numpy arrays) in place and releases the GIL while it runs over a
large one. That matters here: a relay's event loop checksums every payload it receives, and under
google_crc32c (which holds the GIL) the middlebox's kernel thread waited behind it (benchmarks/RESULTS.md,
Capacity: ~12 % of the GIL-holding samples of a relaying middlebox were CRC).

crc32c_combine(crc(A), crc(B), len(B)) == crc(A + B) lets a KvEnd checksum over all chunk payloads reuse each
chunk's CRC instead of a second pass over the bytes (zlib's crc32_combine, for the Castagnoli polynomial).
"""

from __future__ import annotations

import functools

import crc32c as _crc32c

_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected: RFC 3720 §B.4
_X0 = 1 << 31  # the polynomial "1" in reflected bit order


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC32C of any contiguous buffer (a numpy array too: wire's types stop at memoryview)."""
    return _crc32c.crc32c(data)


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
