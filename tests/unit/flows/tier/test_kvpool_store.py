"""The KV pool's storage: LRU within capacity, a write-through disk tier, and CRC32C checks on every read."""

from __future__ import annotations

import pytest

from kvtransit.flows.tier.pool.store import (
    BadBlockFile,
    BlockStore,
    StoredBlock,
    StoredChunk,
    decode_block,
    encode_block,
)
from kvtransit.model.errors import ConfigError
from kvtransit.wire.events import DType


def _block(block_id: int, nbytes: int = 1000, codec: str = "freq-keep-k") -> StoredBlock:
    payload = bytes((block_id + i) % 251 for i in range(nbytes))
    chunk = StoredChunk(layer=0, dtype=DType.BF16, shape=(4, 512, 2), codec_id=1, codec_header=b"hdr",
                        payload=payload, raw_bytes=8192)
    return StoredBlock(block_id, codec, (chunk, chunk))


def test_a_block_file_round_trips_and_names_what_is_wrong_when_damaged():
    block = _block(3)
    data = encode_block(block)
    assert decode_block(3, data, "f") == block
    flipped = bytearray(data)
    flipped[-1] ^= 1
    with pytest.raises(BadBlockFile, match="crc32c mismatch"):
        decode_block(3, bytes(flipped), "f")
    with pytest.raises(BadBlockFile, match="head says"):
        decode_block(3, data[:-5], "f")
    with pytest.raises(BadBlockFile, match="bad magic"):
        decode_block(3, b"XXXX" + data[4:], "f")


def test_a_full_memory_tier_evicts_the_least_recently_used_and_never_refuses_a_writer():
    store = BlockStore(memory_bytes=3 * 2006)  # three blocks of 2 × (1000 + 3) bytes
    assert store.put([_block(1), _block(2), _block(3)]) == 3
    assert [b.block_id for b in store.fetch([1])] == [1]  # 1 is now the most recently used
    assert store.put([_block(4)]) == 1
    assert [b.block_id for b in store.fetch([2])] == []  # 2 was evicted
    assert [b.block_id for b in store.fetch([1, 3, 4])] == [1, 3, 4]
    assert store.counters.evictions["memory"] == 1
    assert store.put([_block(5, nbytes=10**6)]) == 1  # bigger than the tier: not kept, and no wait
    assert store.occupancy()["memory"]["bytes"] <= 3 * 2006


def test_a_fetch_returns_the_leading_run_only():
    store = BlockStore(memory_bytes=10**6)
    store.put([_block(1), _block(3)])
    assert [b.block_id for b in store.fetch([1, 2, 3])] == [1]


def test_the_disk_tier_is_written_through_and_serves_what_memory_evicted(tmp_path):
    store = BlockStore(memory_bytes=2006, disk_dir=tmp_path, disk_bytes=10**6)
    store.put([_block(1), _block(2)])  # memory holds one; disk holds both
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{1:016x}.kvb", f"{2:016x}.kvb"]
    assert [b.block_id for b in store.fetch([2])] == [2]  # the newest is in memory
    fetched = store.fetch([1])  # evicted from memory: served from disk, checked, promoted
    assert fetched == [_block(1)]
    assert store.counters.served == {"memory": 1, "disk": 1}
    assert store.occupancy()["memory"]["blocks"] == 1 and store.fetch([1]) == [_block(1)]
    assert store.counters.served == {"memory": 2, "disk": 1}


def test_a_block_whose_checksum_fails_is_never_served_but_deleted_counted_and_missed(tmp_path):
    store = BlockStore(memory_bytes=2006, disk_dir=tmp_path, disk_bytes=10**6)
    store.put([_block(1), _block(2), _block(3)])  # memory keeps only 3
    path = store.disk_path(2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    got = store.fetch([1, 2, 3])
    assert [b.block_id for b in got] == [1]  # stops at the bad block: the rest is recomputed
    assert store.counters.bad_blocks == 1 and not path.exists()
    assert [b.block_id for b in store.fetch([2])] == []


def test_a_disk_tier_is_reopened_with_what_a_previous_run_left(tmp_path):
    BlockStore(memory_bytes=0, disk_dir=tmp_path, disk_bytes=10**6).put([_block(7)])
    again = BlockStore(memory_bytes=10**6, disk_dir=tmp_path, disk_bytes=10**6)
    assert [b.block_id for b in again.fetch([7])] == [7]


def test_a_full_disk_tier_evicts_its_oldest_files(tmp_path):
    size = len(encode_block(_block(1)))
    store = BlockStore(memory_bytes=0, disk_dir=tmp_path, disk_bytes=2 * size)
    store.put([_block(1), _block(2), _block(3)])
    assert not store.disk_path(1).exists() and store.disk_path(3).exists()
    assert store.counters.evictions["disk"] == 1


def test_a_disk_tier_needs_a_capacity(tmp_path):
    with pytest.raises(ConfigError, match="--disk-capacity"):
        BlockStore(memory_bytes=10, disk_dir=tmp_path, disk_bytes=0)
