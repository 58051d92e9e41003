"""The offered load of a request stream against the modelled system's capacity (model/serving/offered_load.py)."""

from __future__ import annotations

import pytest

from kvtransit.model.cost.roofline import decode_step_s, prefill_step_s
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.offered_load import decode_tokens_per_s, offered_vs_capacity, prefill_share_s
from kvtransit.model.serving.workload import RequestSpec, generate


def _stream(rate: float, n: int, prompt: int, output: int) -> list[RequestSpec]:
    return [RequestSpec(i, i / rate, prompt, output) for i in range(n)]


def test_a_prompt_costs_its_share_of_a_full_batch_of_its_length():
    s = Scenario()
    m, d = s.model_spec, s.device_spec
    assert prefill_share_s(m, d, 1, 2048) == pytest.approx(prefill_step_s(m, d, 1, [2048] * 4) / 4)  # 8192 tokens
    assert prefill_share_s(m, d, 1, 20000) == pytest.approx(prefill_step_s(m, d, 1, [20000]))  # alone


def test_prefill_capacity_is_the_rate_that_fills_the_instances():
    s = Scenario(prefill=2)
    check = offered_vs_capacity(s, _stream(4.0, 41, 2048, 2))
    share = prefill_share_s(s.model_spec, s.device_spec, 1, 2048)
    assert check.offered_rps == pytest.approx(4.0)
    assert check.capacity_rps["prefill"] == pytest.approx(2 / share)
    assert check.utilisation["prefill"] == pytest.approx(4.0 * share / 2)


def test_decode_counts_the_tokens_after_the_first_against_a_full_batch():
    s = Scenario()
    check = offered_vs_capacity(s, _stream(2.0, 21, 1000, 101))
    full = decode_tokens_per_s(s.model_spec, s.device_spec, 1, s.kv_capacity_tokens, 1000, 101)
    assert check.utilisation["decode"] == pytest.approx(2.0 * 100 / full)
    assert offered_vs_capacity(s, _stream(2.0, 21, 1000, 1)).utilisation["decode"] == 0.0  # nothing to decode
    batch = 256  # MAX_DECODE_BATCH: 1101 tokens a sequence fit ~387 times in the KV
    assert full == pytest.approx(batch / decode_step_s(s.model_spec, s.device_spec, 1, batch, round(batch * 1050.5)))


def test_link_busy_is_the_wire_bytes_at_the_modelled_rate_per_channel():
    s = Scenario(codec="none", channels=2)
    check = offered_vs_capacity(s, _stream(1.0, 11, 4096, 2))
    per_request_s = s.model_spec.kv_bytes(4096) / s.link_spec.bandwidth_Bps
    assert check.utilisation["link"] == pytest.approx(per_request_s / 2)
    halved = offered_vs_capacity(Scenario(codec="freq-keep-k", keep=0.5, channels=2), _stream(1.0, 11, 4096, 2))
    assert halved.utilisation["link"] < check.utilisation["link"]


def test_the_default_workload_is_within_capacity_and_warns_nothing():
    s = Scenario()
    check = offered_vs_capacity(s, generate(s.workload))
    assert not check.overloaded and check.warning() is None
    assert all(0 < u < 1 for u in check.utilisation.values() if u is not None)


def test_a_stream_twenty_times_too_fast_is_overloaded_and_the_warning_names_the_bottleneck():
    check = offered_vs_capacity(Scenario(), _stream(60.0, 200, 6000, 350))  # like Mooncake at time-scale 0.05
    assert check.overloaded and check.bottleneck == "prefill"
    warning = check.warning()
    assert warning is not None and "\n" not in warning
    assert "60 req/s offered" in warning and "prefill serves about" in warning
    assert check.as_dict()["overloaded"] is True and check.as_dict()["bottleneck"] == "prefill"


def test_a_closed_loop_client_is_never_called_overloaded():
    check = offered_vs_capacity(Scenario(max_concurrency=4), _stream(60.0, 200, 6000, 350))
    assert check.utilisation["prefill"] > 1 and not check.overloaded and check.warning() is None


def test_a_stream_with_no_span_has_no_rate_to_judge():
    check = offered_vs_capacity(Scenario(), [RequestSpec(i, 0.0, 100, 10) for i in range(5)])
    assert check.offered_rps is None and not check.overloaded and check.bottleneck is None
    assert offered_vs_capacity(Scenario(), []).requests == 0
