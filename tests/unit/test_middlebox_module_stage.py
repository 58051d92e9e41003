"""The middlebox's module stage (agents/middlebox/stages/module.py): a hand-off chunk run in the module pays
both module stages, the encoder's input bits and the far end's decoder's (the wire bits), as the model's
hand-off estimate does; the pool path's single stage stays one stage."""

from __future__ import annotations

import pytest

from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.agents.middlebox.stages.kernel import RUNS_ON_MODULE
from kvtransit.agents.middlebox.stages.module import ModuleStage
from kvtransit.model.catalog.codecs import CODECS
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import model_by_name
from kvtransit.model.cost.handoff import handoff
from kvtransit.model.module.budget import Module
from kvtransit.wire.events import DType, KvChunk

RAW, WIRE = 4096, 1024  # a 4× codec
SCALE = 8.0  # model bytes per payload byte


def chunk_item(runs_on: str) -> ChunkInFlight:
    chunk = KvChunk(1, layer=0, chunk=0, dtype=DType.BF16, shape=(8, 64), codec_id=1, codec_header=b"",
                    payload=bytes(WIRE), raw_bytes=RAW)
    return ChunkInFlight(chunk=chunk, raw_bytes=RAW, codec="freq-keep-k", runs_on=runs_on)


def stage() -> ModuleStage:
    return ModuleStage(Module(), link_rate_Bps=1e9, model_bytes_per_byte=SCALE)


def test_a_handoff_chunk_in_the_module_pays_the_encoder_and_the_far_ends_decoder():
    item = chunk_item(RUNS_ON_MODULE)
    assert stage().handoff_energy_j(item) == pytest.approx((RAW + WIRE) * SCALE * 8 * 1e-12)
    assert stage().energy_j(item) == pytest.approx(RAW * SCALE * 8 * 1e-12)  # one stage (the pool path's)


def test_a_chunk_not_run_in_the_module_costs_the_module_nothing_at_either_end():
    for runs_on in ("host", "gpu", "none"):
        assert stage().handoff_energy_j(chunk_item(runs_on)) == 0.0


def test_the_live_stage_and_the_models_handoff_estimate_count_the_same_two_stages():
    model = model_by_name("llama3-8b")
    est = handoff(model, 2048, LINKS["eth-25g"], CODECS["freq-keep-k"])
    ratio = est.kv_bytes / est.wire_bytes
    kv = model.kv_bytes(2048)
    live = ModuleStage(Module(), link_rate_Bps=1e9, model_bytes_per_byte=1.0)
    chunk = KvChunk(1, layer=0, chunk=0, dtype=DType.BF16, shape=(8, 64), codec_id=1, codec_header=b"",
                    payload=bytes(int(kv / ratio)), raw_bytes=kv)
    item = ChunkInFlight(chunk=chunk, raw_bytes=kv, codec="freq-keep-k", runs_on=RUNS_ON_MODULE)
    assert live.handoff_energy_j(item) == pytest.approx(est.module_energy_j)
