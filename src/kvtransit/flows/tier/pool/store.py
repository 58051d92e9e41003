"""The KV pool's storage: blocks by content hash, in memory (LRU within a byte capacity) over an optional disk
tier (a directory, write-through, its own byte capacity, a CRC32C per block file checked on every read).

A block is what `PoolPut` names: one hash id and its chunks (one per layer), each kept exactly as it crossed
the link, codec header and payload (compact when the link's kernel compresses: compressed once, on the way
in; whoever fetches decompresses). Rules:
- A full tier evicts its least recently used blocks to make room; a writer is never refused or held for
  room (a block bigger than the whole tier is simply not kept there).
- Memory eviction does not lose a block the disk tier holds; a disk hit is promoted back into memory.
- A disk block whose CRC32C (or framing) fails on read is never served: it is deleted, counted in
  `bad_blocks`, and the lookup stops there (a miss from that block on: the prefill recomputes it).

Block file (`<id as 16 hex digits>.kvb`), network byte order:
`b"KVB1" | crc32c(body) u32 | body_length u64 | body`, body = `n_chunks u32` then per chunk
`layer u32, dtype u8, ndim u8, codec_id u16, shape 5×u32, raw_bytes u64, codec_header_length u16,
payload_length u64, codec_header, payload`. Written to a temporary name and renamed, so a crash mid-write
leaves no half block under a real name.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from kvtransit.model.errors import ConfigError
from kvtransit.wire import crc32c
from kvtransit.wire.events import DType, KvChunk

BLOCK_FILE_MAGIC = b"KVB1"
_FILE_HEAD = struct.Struct("!4sIQ")  # magic, crc32c of body, body length
_COUNT = struct.Struct("!I")
_CHUNK = struct.Struct("!IBBH5IQHQ")  # layer, dtype, ndim, codec_id, shape[5], raw_bytes, codec_header_len, payload_len
BLOCK_FILE_SUFFIX = ".kvb"


@dataclass(frozen=True)
class StoredChunk:
    """One layer of one block, as it crossed the link."""

    layer: int
    dtype: DType
    shape: tuple[int, ...]
    codec_id: int
    codec_header: bytes
    payload: bytes
    raw_bytes: int
    # The payload's CRC32C as verified when it arrived, so serving it skips a second pass (None: compute it).
    payload_crc: int | None = field(default=None, compare=False)

    @classmethod
    def of(cls, chunk: KvChunk) -> StoredChunk:
        """A chunk as the pool keeps it (its own copy of the header and payload)."""
        return cls(chunk.layer, chunk.dtype, tuple(chunk.shape), chunk.codec_id, bytes(chunk.codec_header),
                   bytes(chunk.payload), chunk.raw_bytes, chunk.payload_crc)


@dataclass(frozen=True)
class StoredBlock:
    block_id: int
    codec: str
    chunks: tuple[StoredChunk, ...]

    @property
    def nbytes(self) -> int:
        """What it occupies: payloads and codec headers (the bookkeeping around them is not counted)."""
        return sum(len(c.payload) + len(c.codec_header) for c in self.chunks)

    @property
    def raw_bytes(self) -> int:
        return sum(c.raw_bytes for c in self.chunks)


def split_into_blocks(hash_ids, codec: str, chunks, *, per_block: int) -> list[StoredBlock]:
    """A put's chunks as its blocks: `per_block` consecutive chunks each, in the ids' order (the pool's rule for a
    PoolPut's stream; the caller has checked that its chunk count splits evenly)."""
    return [StoredBlock(block_id, codec, tuple(chunks[i * per_block:(i + 1) * per_block]))
            for i, block_id in enumerate(hash_ids)]


class BadBlockFile(Exception):
    """A block file failed its checks; the message says which and why."""


def encode_block(block: StoredBlock) -> bytes:
    parts = [_COUNT.pack(len(block.chunks))]
    codec = block.codec.encode()
    parts.append(struct.pack("!B", len(codec)) + codec)
    for c in block.chunks:
        shape = tuple(c.shape) + (0,) * (5 - len(c.shape))
        parts.append(_CHUNK.pack(c.layer, int(c.dtype), len(c.shape), c.codec_id, *shape, c.raw_bytes,
                                 len(c.codec_header), len(c.payload)))
        parts.append(c.codec_header)
        parts.append(c.payload)
    body = b"".join(parts)
    return _FILE_HEAD.pack(BLOCK_FILE_MAGIC, crc32c(body), len(body)) + body


def decode_block(block_id: int, data: bytes, where: str) -> StoredBlock:
    """The block a file holds, or BadBlockFile naming what is wrong (checksum first, then framing)."""
    if len(data) < _FILE_HEAD.size:
        raise BadBlockFile(f"{where}: {len(data)} bytes, shorter than the {_FILE_HEAD.size}-byte head")
    magic, crc, length = _FILE_HEAD.unpack_from(data)
    if magic != BLOCK_FILE_MAGIC:
        raise BadBlockFile(f"{where}: bad magic {magic!r}")
    body = memoryview(data)[_FILE_HEAD.size:]
    if len(body) != length:
        raise BadBlockFile(f"{where}: body is {len(body)} bytes, the head says {length}")
    actual = crc32c(body)
    if actual != crc:
        raise BadBlockFile(f"{where}: crc32c mismatch (file says {crc:#010x}, computed {actual:#010x})")
    try:
        (n,) = _COUNT.unpack_from(body)
        offset = _COUNT.size
        codec_len = body[offset]
        codec = bytes(body[offset + 1:offset + 1 + codec_len]).decode()
        offset += 1 + codec_len
        chunks = []
        for _ in range(n):
            layer, dtype, ndim, codec_id, s0, s1, s2, s3, s4, raw, hlen, plen = _CHUNK.unpack_from(body, offset)
            offset += _CHUNK.size
            header = bytes(body[offset:offset + hlen])
            offset += hlen
            payload = bytes(body[offset:offset + plen])
            offset += plen
            if len(payload) != plen:
                raise BadBlockFile(f"{where}: chunk payload cut short")
            chunks.append(StoredChunk(layer, DType(dtype), (s0, s1, s2, s3, s4)[:ndim], codec_id, header, payload, raw))
    except (struct.error, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise BadBlockFile(f"{where}: malformed body ({exc})") from None
    if offset != len(body):
        raise BadBlockFile(f"{where}: {len(body) - offset} trailing bytes")
    return StoredBlock(block_id, codec, tuple(chunks))


class _ByteLru:
    """Ids → sizes, least recently used first, within `capacity` bytes."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.sizes: OrderedDict[int, int] = OrderedDict()
        self.used = 0

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.sizes

    def touch(self, block_id: int) -> None:
        self.sizes.move_to_end(block_id)

    def make_room(self, nbytes: int) -> list[int]:
        """Ids to evict (oldest first) so `nbytes` more fit; [] if it can never fit (bigger than the tier)."""
        if nbytes > self.capacity:
            return []
        victims = []
        used = self.used
        for block_id, size in self.sizes.items():
            if used + nbytes <= self.capacity:
                break
            victims.append(block_id)
            used -= size
        return victims

    def add(self, block_id: int, nbytes: int) -> None:
        self.sizes[block_id] = nbytes
        self.used += nbytes

    def remove(self, block_id: int) -> None:
        size = self.sizes.pop(block_id, None)
        if size is not None:
            self.used -= size


@dataclass
class StoreCounters:
    evictions: dict = field(default_factory=lambda: {"memory": 0, "disk": 0})
    served: dict = field(default_factory=lambda: {"memory": 0, "disk": 0})
    bad_blocks: int = 0
    put: dict = field(default_factory=lambda: {"stored": 0, "duplicate": 0, "failed": 0})


class BlockStore:
    """Memory over an optional disk tier (see the module docstring). Not thread-safe: one owner."""

    def __init__(self, memory_bytes: int, *, disk_dir: str | Path | None = None, disk_bytes: int = 0):
        if memory_bytes < 0 or disk_bytes < 0:
            raise ConfigError(f"pool capacities must be >= 0 bytes, got memory {memory_bytes}, disk {disk_bytes}")
        self._memory: dict[int, StoredBlock] = {}
        self._memory_lru = _ByteLru(int(memory_bytes))
        self.disk_dir = Path(disk_dir) if disk_dir else None
        self._disk_lru = _ByteLru(int(disk_bytes))
        self.counters = StoreCounters()
        if self.disk_dir is not None:
            if disk_bytes <= 0:
                raise ConfigError(f"--disk {self.disk_dir}: give the disk tier a capacity (--disk-capacity BYTES)")
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            self._adopt_disk(self.disk_dir)

    # -- tiers ------------------------------------------------------------------------------------------

    def _path(self, block_id: int) -> Path:
        assert self.disk_dir is not None
        return self.disk_dir / f"{block_id:016x}{BLOCK_FILE_SUFFIX}"

    def _adopt_disk(self, disk_dir: Path) -> None:
        """Blocks a previous run left in the directory count against the capacity (checked when read)."""
        for path in sorted(disk_dir.glob(f"*{BLOCK_FILE_SUFFIX}"), key=lambda p: p.stat().st_mtime):
            try:
                block_id = int(path.stem, 16)
            except ValueError:
                continue
            for victim in self._disk_lru.make_room(path.stat().st_size):
                self._drop_disk(victim, evicted=True)
            self._disk_lru.add(block_id, path.stat().st_size)

    def _drop_disk(self, block_id: int, *, evicted: bool) -> None:
        self._disk_lru.remove(block_id)
        self._path(block_id).unlink(missing_ok=True)
        if evicted:
            self.counters.evictions["disk"] += 1

    def _into_memory(self, block: StoredBlock) -> None:
        nbytes = block.nbytes
        victims = self._memory_lru.make_room(nbytes)
        if nbytes > self._memory_lru.capacity:
            return  # bigger than the whole tier: not kept in memory (the disk tier may hold it)
        for victim in victims:
            self._memory_lru.remove(victim)
            del self._memory[victim]
            self.counters.evictions["memory"] += 1
        self._memory[block.block_id] = block
        self._memory_lru.add(block.block_id, nbytes)

    def _write_disk(self, block: StoredBlock) -> None:
        data = encode_block(block)
        if len(data) > self._disk_lru.capacity:
            return
        for victim in self._disk_lru.make_room(len(data)):
            self._drop_disk(victim, evicted=True)
        path = self._path(block.block_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        self._disk_lru.add(block.block_id, len(data))

    def _read_disk(self, block_id: int) -> StoredBlock | None:
        path = self._path(block_id)
        try:
            block = decode_block(block_id, path.read_bytes(), str(path))
        except FileNotFoundError:
            self._disk_lru.remove(block_id)  # removed behind our back: a miss
            return None
        except BadBlockFile:
            self.counters.bad_blocks += 1
            self._drop_disk(block_id, evicted=False)
            return None
        self._disk_lru.touch(block_id)
        return block

    # -- the pool's two operations --------------------------------------------------------------------

    def fetch(self, hash_ids) -> list[StoredBlock]:
        """The blocks of the longest leading run of `hash_ids` held (and checked), most recently used now."""
        found: list[StoredBlock] = []
        for block_id in hash_ids:
            block = self._memory.get(block_id)
            if block is not None:
                self._memory_lru.touch(block_id)
                if self.disk_dir is not None and block_id in self._disk_lru:
                    self._disk_lru.touch(block_id)
                self.counters.served["memory"] += 1
            elif self.disk_dir is not None and block_id in self._disk_lru:
                block = self._read_disk(block_id)
                if block is None:
                    break
                self.counters.served["disk"] += 1
                self._into_memory(block)
            else:
                break
            found.append(block)
        return found

    def put(self, blocks) -> int:
        """Hold these blocks (write-through to disk); returns how many were new. Never waits for room."""
        stored = 0
        for block in blocks:
            if block.block_id in self._memory_lru:
                self._memory_lru.touch(block.block_id)
                self.counters.put["duplicate"] += 1
                continue
            self._into_memory(block)
            if self.disk_dir is not None and block.block_id not in self._disk_lru:
                self._write_disk(block)
            stored += 1
            self.counters.put["stored"] += 1
        return stored

    # -- figures --------------------------------------------------------------------------------------

    def occupancy(self) -> dict:
        tiers = {"memory": {"blocks": len(self._memory), "bytes": self._memory_lru.used,
                            "capacity_bytes": self._memory_lru.capacity}}
        if self.disk_dir is not None:
            tiers["disk"] = {"blocks": len(self._disk_lru.sizes), "bytes": self._disk_lru.used,
                             "capacity_bytes": self._disk_lru.capacity}
        return tiers

    def disk_path(self, block_id: int) -> Path:
        """Where a block's file lives (for tests that damage one)."""
        return self._path(block_id)
