"""The prefill step plan (model/serving/prefill_plan.py): what one batch holds and costs, decided without I/O."""

from __future__ import annotations

import pytest

from kvtransit.model.cost.roofline import prefill_step_s, prefill_work, step_energy_j
from kvtransit.model.scenario import Scenario
from kvtransit.model.serving.prefill_plan import BatchEntry, codec_on_gpu, plan_prefill_step


def entries(*prompts: tuple[int, int], output: int = 16) -> list[BatchEntry]:
    return [BatchEntry(i, prompt, output, cached) for i, (prompt, cached) in enumerate(prompts)]


def test_with_nothing_cached_the_step_is_the_roofline_prefill_of_the_batch_and_its_energy():
    scenario = Scenario(codec="none")
    model, device = scenario.model_spec, scenario.device_spec
    plan = plan_prefill_step(scenario, entries((1000, 0), (3000, 0)))
    assert plan.model_s == prefill_step_s(model, device, scenario.gpus, [1000, 3000])
    assert plan.energy_j == step_energy_j(device, prefill_work(model, [1000, 3000]))


def test_cached_tokens_shorten_the_step_and_cost_less_energy_than_computing_them():
    scenario = Scenario(codec="none")
    whole = plan_prefill_step(scenario, entries((8192, 0)))
    cached = plan_prefill_step(scenario, entries((8192, 4096)))
    assert cached.model_s < whole.model_s
    assert cached.energy_j < whole.energy_j


def test_the_step_is_held_for_its_model_time_times_the_dilation():
    plan = plan_prefill_step(Scenario(codec="none", dilation=4.0), entries((2048, 0)))
    assert plan.wall_s == pytest.approx(plan.model_s * 4.0)


def test_the_codec_on_the_prefill_gpu_adds_its_time_and_energy_per_request():
    transit = Scenario(codec="freq-keep-k", compress_at="transit")
    gpu = Scenario(codec="freq-keep-k", compress_at="gpu")
    batch = entries((2048, 0), (4096, 0))
    base, on_gpu = plan_prefill_step(transit, batch), plan_prefill_step(gpu, batch)
    assert on_gpu.model_s == pytest.approx(base.model_s + gpu.gpu_codec_s(2048) + gpu.gpu_codec_s(4096))
    extra_j = sum(step_energy_j(gpu.device_spec, gpu.gpu_codec_work(n)) for n in (2048, 4096))
    assert on_gpu.energy_j == pytest.approx(base.energy_j + extra_j)


def test_without_a_codec_compress_at_gpu_costs_nothing_extra():
    none_on_gpu = Scenario(codec="none", compress_at="gpu")
    assert not codec_on_gpu(none_on_gpu)
    batch = entries((2048, 0))
    assert plan_prefill_step(none_on_gpu, batch) == plan_prefill_step(Scenario(codec="none"), batch)


def test_only_requests_with_more_than_one_output_token_are_handed_off_to_decode():
    batch = [BatchEntry(1, 100, 1), BatchEntry(2, 100, 2), BatchEntry(3, 100, 1)]
    plan = plan_prefill_step(Scenario(codec="none"), batch)
    assert [e.request_id for e in plan.handoffs] == [2]
    assert [e.request_id for e in plan.done_at_prefill] == [1, 3]
    assert plan.entries == tuple(batch)  # in batch order: first tokens go out in that order
