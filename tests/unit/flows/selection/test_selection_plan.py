"""What a live selection run holds and sends (flows/selection/run.py: plan_selection) and the bytes of each leg
(flows/selection/context.py), before any process starts: the model's step, where the scoring runs, the effective
scale, the model at the bytes moved; bad input is one line (flows/selection/cli.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kvtransit.cli import main
from kvtransit.cli.accuracy import default_sample_path
from kvtransit.flows.selection.context import LegError, RemoteContext
from kvtransit.flows.selection.model import MODULE_LOW, SelectionStep
from kvtransit.flows.selection.run import plan_selection
from kvtransit.kernels.selection import group_scores, rank_pages, select_pages
from kvtransit.model.catalog.devices import DEVICES
from kvtransit.model.catalog.links import LINKS
from kvtransit.model.catalog.models import MODELS
from kvtransit.model.cost.roofline import decode_step_s
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Module, Policy

LLAMA8, H100, ETH100 = MODELS["llama3-8b"], DEVICES["h100"], LINKS["eth-100g"]
SAMPLE = str(default_sample_path())


def _plan(**kw):
    return plan_selection(LLAMA8, H100, ETH100, context=32768, sample=SAMPLE, **kw)


def test_a_step_is_the_fetch_then_the_decode_compute_at_the_context_attended():
    plan = _plan(budget=1 / 16)
    step = SelectionStep(LLAMA8, 32768, 1 / 16)
    assert plan.model_fetch_s == pytest.approx(step.fetch_time_s(ETH100, Module()))
    assert plan.model_compute_s == pytest.approx(decode_step_s(LLAMA8, H100, 1, 1, 128 * 16))
    everything = _plan(budget=None)
    assert everything.model_fetch_s == pytest.approx(2 * 20e-6 + 32768 * 131072 / 12.5e9)
    assert everything.model_compute_s == pytest.approx(decode_step_s(LLAMA8, H100, 1, 1, 32768))
    assert everything.scoring == "-" and plan.scoring == "transit"


def test_the_scale_is_the_samples_kv_over_the_models_and_the_model_is_also_read_at_the_bytes_moved():
    plan = _plan(budget=1 / 4)
    # 384 tokens × (6 layers × K, V × 3 kv heads × 64 × 2 B) for 32,768 × 131,072 B.
    assert plan.effective_scale == pytest.approx(384 * 4608 / (32768 * 131072))
    modelled = SelectionStep(LLAMA8, 32768, 1 / 4)
    at_model_bytes = plan.fetch_at_bytes_s(modelled.summary_bytes * plan.effective_scale,
                                           modelled.chosen_kv_bytes * plan.effective_scale)
    assert at_model_bytes == pytest.approx(plan.model_fetch_s)


def test_the_mean_key_is_scored_in_transit_slowed_at_the_low_budget_and_quests_bound_only_on_the_host():
    low = _plan(module=MODULE_LOW)
    assert low.scoring == "transit" and low.role_plan()["module_occupancy"] == pytest.approx(2.5)
    assert low.model_fetch_s > _plan().model_fetch_s
    with pytest.raises(ConfigError, match=r"needs comparison.*--policy host scores them at the decode host"):
        _plan(kind="minmax")
    host = _plan(kind="minmax", policy=Policy.HOST)
    assert host.scoring == "host" and host.role_plan()["module_latency_s"] == 0.0


def test_the_legs_carry_the_samples_pages_and_the_modules_scores_pick_what_the_offline_selection_picks():
    ctx = RemoteContext.load(SAMPLE, "prose", 16)
    step = 5
    pos = ctx.position(step)
    assert (ctx.pages(step), ctx.tail(step)) == ((pos + 1) // 16, (pos + 1) % 16)
    summaries = ctx.summaries_from(ctx.summary_bytes(step, "mean"), step, "mean")
    query = ctx.query_from(ctx.query_bytes(step), step)
    ids = rank_pages(group_scores(query, summaries), 1 / 4, 1)
    for layer in range(ctx.layers):
        paged = ctx.pages(step) * 16
        expected = select_pages(query[layer], ctx.sample.k[layer, :, :paged], 1 / 4, sink_pages=1)
        np.testing.assert_array_equal(ids[layer], expected)
    kv = ctx.pages_from(ctx.pages_payload(step, ids.astype(np.int32)).tobytes(), step, ids.shape[-1])
    first = int(ids[2, 1, 1])
    np.testing.assert_array_equal(kv[2, 0, 1, 16:32], ctx.sample.k[2, 1, first * 16:(first + 1) * 16])
    np.testing.assert_array_equal(kv[2, 1, 1, -ctx.tail(step):], ctx.sample.v[2, 1, ctx.pages(step) * 16:pos + 1])


def test_a_leg_that_is_not_this_steps_is_refused_with_what_was_wrong():
    ctx = RemoteContext.load(SAMPLE, "prose", 16)
    with pytest.raises(LegError, match=r"SCORES at step 0: 12 B, expected 1584 B"):
        ctx.scores_from(b"\x00" * 12, 0)
    with pytest.raises(LegError, match=r"FETCH at step 0: page ids 0\.\.99 outside the context's 22 whole pages"):
        ctx.ids_from(np.array([0, 99] * 9, np.int32).tobytes(), 0)
    with pytest.raises(LegError, match="do not split over 6 layers x 3 kv heads"):
        ctx.ids_from(np.zeros(5, np.int32).tobytes(), 0)


@pytest.mark.parametrize("kw, message", [
    (dict(budget=0.0), "page budget must be a fraction in (0, 1]"),
    (dict(budget=1.5), "page budget must be a fraction in (0, 1]"),
    (dict(page_size=24), "page size 24 does not divide the context's 512-token blocks"),
    (dict(page_size=512), "page size 512 does not divide the context's 384 tokens"),
    (dict(text="poetry"), "no text 'poetry'"),
    (dict(steps=0), "--steps must be >= 1"),
    (dict(kind="median"), "unknown summary kind 'median'"),
])
def test_a_selection_that_cannot_run_is_refused_with_the_reason(kw, message):
    with pytest.raises(ConfigError) as info:
        _plan(**kw)
    assert message in str(info.value)


@pytest.mark.parametrize("argv, expected", [
    (["--budget", "0"], "page budget must be a fraction in (0, 1]"),
    (["--budget", "one"], "argument --select-budget/--budget: expected a number, got 'one'"),
    (["--summary", "minmax"], "--policy host scores them at the decode host (valid: --policy reject|host)"),
    (["--select", "all", "--no-baseline"], "--no-baseline goes with --select top-k"),
])
def test_bad_select_flags_are_one_line_and_exit_2(capsys, argv, expected):
    try:
        code = main(["select", *argv])
    except SystemExit as exc:  # argparse's own refusals exit from the parser
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
