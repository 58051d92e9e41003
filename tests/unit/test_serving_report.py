"""The pieces of the serving loop that need no process: KV framing, the link meter, the run report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ml_dtypes import bfloat16

from kvtransit.agents.common import kv_frames
from kvtransit.agents.decode.accuracy_sample import AccuracyMeter
from kvtransit.agents.decode.link_meter import LinkMeter
from kvtransit.agents.process import parse_address, parse_addresses, parse_ready_line
from kvtransit.model.errors import ConfigError
from kvtransit.model.judge.slo import RequestRecord
from kvtransit.model.scenario import Scenario
from kvtransit.report.build import REPORT_KEYS, build_report, write_report
from kvtransit.report.text import to_markdown


def test_row_slices_keep_whole_token_rows_and_respect_the_chunk_bound():
    pieces = kv_frames.row_slices(layers=2, rows_per_layer=16, row_bytes=3 * 1024 * 1024)  # 2 rows per 8 MiB
    assert len(pieces) == 16 and all(p.stop - p.start == 2 for p in pieces)
    assert [p.layer for p in pieces] == [0] * 8 + [1] * 8
    whole = kv_frames.row_slices(layers=3, rows_per_layer=16, row_bytes=1024)
    assert [(p.layer, p.start, p.stop) for p in whole] == [(0, 0, 16), (1, 0, 16), (2, 0, 16)]
    huge = kv_frames.row_slices(layers=1, rows_per_layer=2, row_bytes=9 * 1024 * 1024)  # a row over the bound
    assert [(p.start, p.stop) for p in huge] == [(0, 1), (1, 2)]


def test_raw_chunk_carries_the_rows_bytes_without_a_codec():
    rows = np.arange(2 * 4 * 3, dtype=np.float32).astype(bfloat16).reshape(2, 4, 3)
    chunk = kv_frames.raw_chunk(7, 0, kv_frames.RowSlice(0, 1, 2), rows)
    assert chunk.codec_id == 0 and chunk.shape == (1, 4, 3) and chunk.raw_bytes == 24
    assert bytes(chunk.payload) == rows[1:2].tobytes()


def test_addresses_parse_and_bad_ones_name_the_flag():
    assert str(parse_address("127.0.0.1:0", "--listen")) == "127.0.0.1:0"
    assert [a.port for a in parse_addresses("a:1,b:2", "--decode")] == [1, 2]
    for bad in ("nohost", ":80", "h:x", "h:70000"):
        with pytest.raises(ConfigError, match="--listen"):
            parse_address(bad, "--listen")


def test_ready_line_round_trip():
    line = 'KVTRANSIT-READY {"role": "decode", "listen_port": 5}'
    assert parse_ready_line(line) == {"role": "decode", "listen_port": 5}
    assert parse_ready_line("something else") is None


def test_link_meter_counts_busy_time_as_the_union_of_transfers():
    meter = LinkMeter()
    meter.begin(0)
    meter.begin(50)  # overlaps the first
    meter.end(100, 1000, 2000)
    meter.end(150, 1000, 2000)
    meter.begin(1000)  # after an idle gap
    meter.end(1100, 500, 1000)
    assert meter.busy_ns == 150 + 100 and meter.wire_bytes == 2500 and meter.raw_bytes == 5000
    assert meter.achieved_Bps == pytest.approx(2500 / 250e-9)


def test_link_meter_counts_remote_kv_bytes_that_shared_a_hand_offs_time_on_the_link():
    meter = LinkMeter()
    meter.shared(400)  # no hand-off on the link: the meter's rate does not divide them
    meter.begin(0)
    meter.shared(600)  # a remote leg's answer arrived while a hand-off was on the link: it took some of its time
    meter.end(100, 1000, 2000)
    assert meter.shared_bytes == 600 and meter.wire_bytes == 1000
    assert meter.achieved_Bps == pytest.approx(1600 / 100e-9)


def test_accuracy_meter_is_relative_error_over_all_values():
    ref = np.ones((4, 8, 2), dtype=np.float32)  # 2 heads: rows 0-1 are K, 2-3 are V
    got = ref.copy()
    got[2:] *= 1.5
    meter = AccuracyMeter()
    meter.add(ref, got, heads=2)
    assert meter.relative("k") == 0.0 and meter.relative("v") == pytest.approx(0.5)


def _record(rid, arrival, first, step, n, kv_ready):
    return RequestRecord(rid, arrival, 2048, n, [first + k * step for k in range(n)], kv_ready)


def test_report_from_client_records_and_agent_stats(tmp_path):
    scenario = Scenario(codec="freq-keep-k", compress_at="transit", scale=0.0625)  # eth-25g shaped to 195 MB/s
    records = [_record(i, float(i), i + 0.06, 0.01, 5, i + 0.06 + 0.086) for i in range(10)]
    decode = {"role": "decode", "name": "decode-0", "gpu_energy_j": 10.0, "shortest_step_wall_s": 0.0062,
              "timer_lateness_p99_s": 1e-5, "timer_lateness_mean_s": 5e-6,
              "link": {"wire_bytes": 8e6, "raw_bytes": 16e6, "busy_s": 0.08, "transfers": 10},
              "accuracy": {"sampled_requests": 2, "k_relative_error": 0.26, "v_relative_error": 0.61}}
    prefill = {"role": "prefill", "name": "prefill-0", "gpu_energy_j": 5.0, "shortest_step_wall_s": 0.059,
               "timer_lateness_p99_s": 1e-5, "timer_lateness_mean_s": 5e-6}
    # The module's energy is the middlebox's own counter (1 pJ per input bit of the modelled bytes, docs/reference.md
    # §5).
    middlebox = {"role": "middlebox", "name": "middlebox", "module_energy_j": 16e6 / scenario.effective_scale * 8e-12}
    report = build_report(scenario, records, [decode, prefill, middlebox], run_wall_s=10.0, tokens_delivered=50)
    assert set(REPORT_KEYS) <= set(report)
    assert report["requests"]["ok"] == 10 and report["slo_attainment"] == 1.0
    assert report["handoff_s"]["mean"] == pytest.approx(0.086)
    scale = scenario.effective_scale
    assert report["link"]["wire_bytes"] == pytest.approx(8e6 / scale)
    assert report["link"]["kv_bytes"] == pytest.approx(16e6 / scale)
    assert report["link"]["achieved_Bps"] == pytest.approx(8e6 / scale / 0.08)
    assert report["energy_j"]["gpu"] == 15.0
    assert report["energy_j"]["link"] == pytest.approx(8e6 / scale * 8 * 15e-12)  # eth-25g: 15 pJ/bit
    assert report["energy_j"]["module"] == pytest.approx(16e6 / scale * 8 * 1e-12)  # 1 pJ per input bit
    assert report["accuracy"]["v_relative_error"] == 0.61
    assert report["fidelity"]["link_rate"]["ok"] is False  # 8 MB in 80 ms = 100 MB/s, half the scaled 195 MB/s
    assert report["faithful"] is False
    json_path, md_path = write_report(report, tmp_path / "r.json")
    assert json.loads(json_path.read_text())["requests"]["total"] == 10
    assert "| TTFT |" in md_path.read_text()


def test_report_without_agent_stats_has_nulls_not_inventions():
    report = build_report(Scenario(), [_record(0, 0.0, 0.05, 0.01, 3, None)], [], run_wall_s=1.0, tokens_delivered=3)
    assert report["link"]["wire_bytes"] is None
    assert report["energy_j"] == {"link": None, "module": None, "gpu": None, "pool": None,
                                 "remote_kv": None}
    assert report["faithful"] is False  # nothing was measured: never a silent pass
    assert report["j_per_token"] is None and report["accuracy"]["k_relative_error"] is None
    # The five tests fail closed too: nothing sampled, no frames counted.
    tests = {t["test"]: t for t in report["verdict"]["tests"]}
    assert report["verdict"]["candidate"] is False
    assert tests["precision"]["passed"] is None and tests["budget"]["passed"] is None
    assert "TTFT" in to_markdown(report)
