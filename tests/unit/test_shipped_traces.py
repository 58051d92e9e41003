"""The Mooncake traces ship inside the package (kvtransit/data/traces/): each is the file its provenance names, byte
for byte, and `--trace NAME` replays it from any working directory."""

from __future__ import annotations

import gzip
import hashlib
import re

import pytest

from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.traces import SHIPPED_TRACES, TraceError
from kvtransit.workload.trace_file import SHIPPED_DIR, load_trace, trace_path

PROVENANCE = (SHIPPED_DIR / "PROVENANCE.md").read_text()


@pytest.mark.parametrize("name", sorted(SHIPPED_TRACES))
def test_each_shipped_trace_is_the_file_its_provenance_names(name):
    row = next(line for line in PROVENANCE.splitlines() if line.startswith(f"| `{name}`"))
    digest = re.findall(r"`([0-9a-f]{64})`", row)[0]
    with gzip.open(trace_path(name), "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == digest


def test_the_licence_and_provenance_ship_beside_the_traces():
    assert "Apache License" in (SHIPPED_DIR / "LICENSE").read_text()
    assert "3b5a594133958449a1feaf1c9e0fc1b553e34a28" in PROVENANCE


def test_a_shipped_trace_replays_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay = load_trace(Scenario(trace="mooncake-synthetic", requests=5))
    assert len(replay.requests) == 5 and replay.applied["trace_requests"] == 3993
    assert all(spec.hash_ids for spec in replay.requests)


def test_a_gzip_trace_given_by_path_is_read_too(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n')
    assert load_trace(Scenario(trace=str(path), requests=1)).requests[0].prompt_tokens == 600


def test_a_truncated_gzip_trace_is_a_one_line_error(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"timestamp": 0, "input_length": 6, "output_length": 4}\n' * 50)[:40])
    with pytest.raises(TraceError, match=r"trace: cannot read .*t\.jsonl\.gz"):
        load_trace(Scenario(trace=str(path), requests=1))
