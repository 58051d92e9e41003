"""The real-model accuracy tools' parts that need no model: the extra's absence said in one line, the
default install never importing torch, codec settings and their keys, token subsampling at band-keep's bytes, the
middlebox's chunking, windows, the needle's prompt and page selection. No torch needed: these run everywhere."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kvtransit.agents.common.kv_frames import row_slices
from kvtransit.kernels.bandkeep import layout_for
from kvtransit.kernels.page_scoring import page_representatives
from kvtransit.kernels.registry import get_codec
from kvtransit.model.judge.task_accuracy import codec_key
from kvtransit.realmodel import kv_codecs, needle, texts
from kvtransit.realmodel.errors import RealModelError


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # starts a process
def test_the_agents_that_carry_and_read_real_kv_import_neither_torch_nor_transformers():
    # The model runs in a worker process of its own (agents/common/model_worker.py), never in an agent.
    done = _run_python("""
        import sys
        import kvtransit.agents.prefill.agent, kvtransit.agents.decode.agent, kvtransit.agents.loadgen.agent
        import kvtransit.agents.common.model_worker, kvtransit.realmodel.live
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow  # starts a process
def test_importing_the_cli_and_the_models_pure_parts_loads_neither_torch_nor_transformers():
    done = _run_python("""
        import contextlib, io, sys
        from kvtransit.cli import build_parser
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            build_parser().parse_args(["accuracy", "--help"])
        import kvtransit.realmodel.kv_codecs, kvtransit.realmodel.needle, kvtransit.realmodel.report
        import kvtransit.realmodel.extra, kvtransit.realmodel.texts
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("mode", ["--end-to-end", "--needle"])
def test_without_the_extra_the_command_names_the_packages_to_install_and_exits_2(mode):
    # torch and transformers made unimportable in a real process (a None in sys.modules is what Python itself
    # uses to mark a module that cannot be imported; importlib.util.find_spec then finds nothing).
    done = _run_python(f"""
        import sys
        sys.modules["torch"] = None
        sys.modules["transformers"] = None
        from kvtransit.cli import main
        sys.exit(main(["accuracy", "{mode}"]))
    """)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "missing: torch, transformers" in lines[0] and "pip install -e '.[realkv]'" in lines[0]


def test_every_spec_name_parses_back_to_the_same_setting_and_keys_are_unique():
    specs = kv_codecs.default_specs()
    assert [kv_codecs.parse_spec(s.name) for s in specs] == specs
    assert len({s.key for s in specs}) == len(specs)
    # The grid the issue asks for: 5 requantisers, 12 band-keep, 6 subsampling, 18 precision_bits, 3 pre-RoPE.
    assert len(specs) == 5 + 12 + 6 + 18 + 3


def test_a_spec_key_is_the_key_a_runs_scenario_gives():
    spec = kv_codecs.parse_spec("freq-keep-k/fft/keep=0.25/sinks=0/bits=8")
    assert spec.key == codec_key("freq-keep-k", keep=0.25, block=64, sinks=0, variant="fft", precision_bits=8)
    assert kv_codecs.parse_spec("fp8").key == codec_key("fp8", block=64) == "fp8 block=64"
    assert kv_codecs.parse_spec("kivi-3").key == "kivi-3"


def test_families_expand_and_duplicates_are_dropped():
    specs = kv_codecs.parse_specs("none,fp8,none,subsample")
    assert [s.name for s in specs][:2] == ["none", "fp8"] and len(specs) == 2 + 6


@pytest.mark.parametrize("bad, says", [
    ("zstd", "is not a codec"),
    ("freq-keep-k/keep=0.5/sinks=4", "needs a variant"),
    ("freq-keep-k/dct/keep=1.5/sinks=4", "keep must be in (0, 1]"),
    ("subsample/keep=0.5", "needs keep= and sinks="),
    ("subsample/keep=0.5/sinks=4/bits=8", "takes only"),
    ("", "no codec"),
])
def test_a_bad_codec_setting_is_refused_in_one_line_naming_it(bad, says):
    with pytest.raises(RealModelError, match="--codecs") as info:
        kv_codecs.parse_specs(bad)
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("tokens", [1024, 1000, 70, 5])
@pytest.mark.parametrize("keep", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("sinks", [0, 4])
def test_subsampling_keeps_as_many_tokens_as_band_keeps_payload_rows(tokens, keep, sinks):
    kept = kv_codecs.subsample_indices(tokens, keep, sinks)
    assert kept.size == layout_for((6, tokens, 64), keep, 64, min(sinks, tokens), "dct").kept_tokens
    assert np.all(np.diff(kept) > 0) and kept[-1] == tokens - 1  # distinct, sorted, the last token kept
    assert list(kept[: min(sinks, tokens)]) == list(range(min(sinks, tokens)))


def test_subsampling_at_half_the_bytes_is_every_second_token_counted_from_the_end():
    assert list(kv_codecs.subsample_indices(12, 0.5, 0, block=4)) == [1, 3, 5, 7, 9, 11]


def test_apply_runs_the_registrys_codec_a_layer_at_a_time():
    rng = np.random.default_rng(0)
    layers = [kv_codecs.to_wire(rng.standard_normal((6, 80, 64)).astype(np.float32), "bfloat16") for _ in range(3)]
    spec = kv_codecs.parse_spec("freq-keep-k/dct/keep=0.5/sinks=4")
    out = kv_codecs.apply(spec, layers)
    codec = get_codec("freq-keep-k", keep=0.5, block=64, sinks=4, variant="dct")
    for rows, decoded in zip(layers, out.layers, strict=True):
        enc = codec.encode(rows)
        assert np.array_equal(decoded.view(np.uint16), codec.decode(enc.header, enc.payload).view(np.uint16))
    assert out.wire_bytes == 3 * codec.encode(layers[0]).wire_bytes and out.raw_bytes == sum(x.nbytes for x in layers)
    exact = kv_codecs.apply(kv_codecs.parse_spec("none"), layers)
    assert all(np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(exact.layers, layers, strict=True))


def test_a_smollm2_layer_is_one_middlebox_chunk_up_to_its_longest_context():
    # kv_codecs encodes a whole layer's rows at once: what kv_frames does whenever a layer fits one chunk.
    rows, row_bytes = 2 * 3, 8192 * 64 * 2  # 2·kv_heads rows of 8,192 bf16 tokens of head_dim 64
    slices = row_slices(30, rows, row_bytes)
    assert [(s.layer, s.start, s.stop) for s in slices] == [(layer, 0, rows) for layer in range(30)]


def test_a_window_past_the_texts_end_is_refused_with_the_lengths():
    window = texts.Window("gpl-3", 100, 50, 10)
    assert texts.window_tokens(window, list(range(161))) == list(range(100, 161))
    with pytest.raises(RealModelError, match=r"gpl-3@100: needs tokens 100\.\.160 .* but gpl-3 has 160 tokens"):
        texts.window_tokens(window, list(range(160)))


@pytest.mark.parametrize("bad", ["gpl-3", "lorem:0", "gpl-3:x", ","])
def test_a_bad_window_list_is_refused(bad):
    with pytest.raises(RealModelError, match="--windows"):
        texts.parse_windows(bad, 64, 16)


def test_the_default_windows_are_two_per_text_and_do_not_overlap():
    windows = texts.default_windows()
    assert [(w.text, w.offset) for w in windows] == [("gpl-3", 0), ("gpl-3", 3072), ("json-decoder", 0),
                                                     ("json-decoder", 1536)]
    for a, b in itertools.pairwise(windows):
        assert a.text != b.text or a.offset + a.span <= b.offset


def _fake_tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]  # one token per character: lengths are easy to check


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_needle_prompt_fits_the_context_and_holds_the_key_at_its_depth(depth):
    ids = needle.build_prompt(_fake_tokenize, 2000, depth, "48213")
    text = "".join(map(chr, ids))
    filler = len(needle.FILLER)
    assert 2000 - filler < len(ids) <= 2000
    assert text.startswith(needle.INTRO) and text.endswith(needle.QUESTION) and text.count("48213") == 2
    before = text.index(needle.NEEDLE.format(key="48213")) - len(needle.INTRO)
    units = (2000 - len(needle.INTRO) - len(needle.NEEDLE.format(key="48213")) - len(needle.QUESTION)) // filler
    assert before == round(depth * units) * filler


def test_a_context_too_short_for_the_needle_is_refused():
    with pytest.raises(RealModelError, match="no room for filler"):
        needle.build_prompt(_fake_tokenize, 100, 0.5, "48213")


def test_pass_keys_are_five_digits_and_fixed_by_seed_and_depth():
    keys = {needle.pass_key(s, d) for s in (1, 2) for d in needle.DEPTHS}
    assert len(keys) == 6 and all(len(k) == 5 and k.isdigit() for k in keys)
    assert needle.pass_key(1, 0.5) == needle.pass_key(1, 0.5)


def test_default_needle_contexts_grow_to_the_models_limit():
    assert needle.default_contexts(8192) == [512, 2048, 8192]
    assert needle.default_contexts(2048) == [512, 2048]


def test_page_selection_keeps_the_first_and_last_pages_and_the_pages_the_query_points_at():
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((3, 16 * 10 + 5, 8)).astype(np.float32)  # 11 pages, the last ragged
    target = 6  # the page whose mean key the query heads of every kv head align with
    reps = page_representatives(keys, needle.PAGE_SIZE)
    queries = np.repeat(reps[:, target] * 50, 3, axis=0)  # 9 query heads, 3 per kv head (GQA)
    idx = needle.select_pages(keys, queries, budget=3 / 11)
    expected = np.concatenate([np.arange(16), np.arange(96, 112), np.arange(160, 165)])
    assert idx.shape == (3, expected.size)
    assert all(np.array_equal(row, expected) for row in idx)


def test_needle_refuses_pre_rope_codecs_and_budgets_outside_zero_to_one():
    with pytest.raises(RealModelError, match="before RoPE"):
        needle.arms_from([kv_codecs.parse_spec("freq-keep-k/dct/keep=0.5/sinks=4/pre-rope")], [])
    with pytest.raises(RealModelError, match="in \\(0, 1\\]"):
        needle.arms_from([], [1.5])
