"""The OpenAI API as the front end speaks it, sans I/O: request bodies in, a `Job` or an `OpenAIError` out;
response bodies and server-sent-event chunks shaped from a job and what the testbed delivered.

No sockets, clock or event loop here: the caller passes the bytes it read, a `TokenCounter`, and `created` (Unix
seconds) for the response bodies. What is honoured, and how (vLLM's OpenAI-compatible server is the reference
for everything OpenAI's own API leaves open: vllm/entrypoints/openai/protocol.py):

- `max_tokens` (completions; default 16, OpenAI's documented default for /v1/completions) and
  `max_completion_tokens` (chat; it wins over the deprecated `max_tokens`, as in vLLM; default: the rest of the
  context, as vLLM does). The output length of the testbed request is exactly this: the emulator has no
  end-of-sequence token to stop early on, so every request runs to its limit, which is what `ignore_eos`
  asks for anyway. `ignore_eos` (bool) and `min_tokens` (0 ≤ min_tokens ≤ max_tokens, vLLM's rule) are
  validated and accepted.
- The context: prompt tokens + max_tokens ≤ the context (the scenario's `context_cap`, docs/reference.md §4's 32,768),
  else 400 `context_length_exceeded`, vLLM's message.
- `stream`, `stream_options.include_usage` (only with stream, else 400, as in vLLM); `n` must be 1.
- `prompt`: a string, or a list of token ids (its length is the prompt length), or a list holding one of
  either; a batch of prompts is refused (one testbed request per HTTP request). `messages`: a non-empty list of
  {role, content} objects, content a string, null or a list of text parts.
- Errors are OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with HTTP status 400 for a bad
  request (malformed JSON, unknown model, max_tokens ≤ 0 or past the context).

Each output token is one `FILLER_WORD` of text; a streamed chunk carries exactly one, sent when the testbed
delivered that token, so a client's TTFT and ITL are the emulated ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

# One token per repetition in SmolLM2's BPE (measured: " the" × 20 tokenizes to 20 ids) and in the GPT BPEs,
# so a tool that counts output tokens by re-tokenizing the text (rather than reading `usage`) counts N for N.
FILLER_WORD = " the"
# OpenAI's API reference, /v1/completions: "max_tokens ... Defaults to 16".
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
OWNED_BY = "kvtransit"
SSE_DONE = b"data: [DONE]\n\n"

Kind = Literal["completion", "chat"]


class TokenCounter(Protocol):
    """How many tokens a prompt is (prompt_tokens.py: the served model's tokenizer, or a byte estimate)."""

    name: str

    def text(self, text: str) -> int: ...

    def chat(self, messages: Sequence[dict[str, str]]) -> int: ...


class OpenAIError(Exception):
    """A request the API refuses: HTTP `status`, and OpenAI's error object."""

    def __init__(self, status: int, message: str, *, error_type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.error_type, self.param, self.code = status, message, error_type, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, error_type=self.error_type, param=self.param, code=self.code)


def error_body(message: str, *, error_type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def http_error_body(status: int, message: str) -> dict[str, Any]:
    """The shape of an error the HTTP layer answers itself (no route, wrong method, bad head)."""
    kind = "not_found_error" if status == 404 else "invalid_request_error" if status < 500 else "server_error"
    return error_body(message, error_type=kind)


@dataclass(frozen=True)
class Limits:
    """What the served model takes: its names, and its context in tokens."""

    models: tuple[str, ...]
    context_tokens: int


@dataclass(frozen=True)
class Job:
    """One parsed request: what the testbed is asked for, and how to answer."""

    kind: Kind
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    min_tokens: int = 0
    ignore_eos: bool = False


# -- requests ---------------------------------------------------------------------------------------------------


def parse_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 naming where it broke."""
    try:
        data = json.loads(body)
    except UnicodeDecodeError as exc:
        raise OpenAIError(400, f"request body is not UTF-8 JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
                               f"(char {exc.pos})") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, f"request body must be a JSON object, got {type(data).__name__}")
    return data


def parse_completion(body: bytes, counter: TokenCounter, limits: Limits) -> Job:
    """POST /v1/completions."""
    data = parse_body(body)
    model = _model(data, limits)
    prompt_tokens = _prompt_tokens(data.get("prompt"), counter)
    max_tokens = _positive_int(data, "max_tokens")
    return _job("completion", data, model, prompt_tokens, max_tokens, limits, default=COMPLETIONS_DEFAULT_MAX_TOKENS)


def parse_chat(body: bytes, counter: TokenCounter, limits: Limits) -> Job:
    """POST /v1/chat/completions."""
    data = parse_body(body)
    model = _model(data, limits)
    messages = _messages(data.get("messages"))
    prompt_tokens = counter.chat(messages)
    # vLLM: max_completion_tokens, when given, is the limit; max_tokens is its deprecated alias.
    max_tokens = _positive_int(data, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _positive_int(data, "max_tokens")
    return _job("chat", data, model, prompt_tokens, max_tokens, limits, default=None)


def _job(kind: Kind, data: dict[str, Any], model: str, prompt_tokens: int, max_tokens: int | None, limits: Limits,
         *, default: int | None) -> Job:
    context = limits.context_tokens
    if prompt_tokens < 1:
        raise OpenAIError(400, "the prompt is empty: at least one token is needed", param=_prompt_param(kind))
    if prompt_tokens >= context:
        raise OpenAIError(400, f"This model's maximum context length is {context} tokens. However, your prompt "
                               f"is {prompt_tokens} tokens, which leaves no room for a completion. Please reduce "
                               "the length of the prompt.", param=_prompt_param(kind), code="context_length_exceeded")
    if max_tokens is None:  # OpenAI's default for completions; the rest of the context for chat, as vLLM does
        max_tokens = default if default is not None else context - prompt_tokens
    if prompt_tokens + max_tokens > context:
        raise OpenAIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                               f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                               f"{'messages' if kind == 'chat' else 'prompt'}, {max_tokens} in the completion). "
                               "Please reduce the length of the prompt or completion.",
                          param=_max_tokens_param(kind, data), code="context_length_exceeded")
    stream = _bool(data, "stream")
    include_usage = _stream_options(data, stream)
    n = data.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise OpenAIError(400, f"n must be 1 (the emulator serves one choice per request), got {n!r}", param="n")
    min_tokens = _int_at_least(data, "min_tokens", 0)
    if min_tokens > max_tokens:
        raise OpenAIError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}",
                          param="min_tokens")
    return Job(kind, model, prompt_tokens, max_tokens, stream=stream, include_usage=include_usage,
               min_tokens=min_tokens, ignore_eos=_bool(data, "ignore_eos"))


def _prompt_param(kind: Kind) -> str:
    return "messages" if kind == "chat" else "prompt"


def _max_tokens_param(kind: Kind, data: dict[str, Any]) -> str:
    return "max_completion_tokens" if kind == "chat" and data.get("max_completion_tokens") is not None else "max_tokens"


def _model(data: dict[str, Any], limits: Limits) -> str:
    model = data.get("model")
    if model is None:  # vLLM serves its one model to a request that names none
        return limits.models[0]
    if not isinstance(model, str):
        raise OpenAIError(400, f"model must be a string, got {type(model).__name__}", param="model")
    if model not in limits.models:
        raise OpenAIError(400, f"The model `{model}` does not exist (served: {', '.join(limits.models)}).",
                          param="model", code="model_not_found")
    return model


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise OpenAIError(400, f"{key} must be an integer, got {value!r}", param=key)
    if value < 1:
        raise OpenAIError(400, f"{key} must be at least 1, got {value}", param=key)
    return int(value)


def _int_at_least(data: dict[str, Any], key: str, lowest: int) -> int:
    value = data.get(key)
    if value is None:
        return lowest
    if not _is_int(value) or value < lowest:
        raise OpenAIError(400, f"{key} must be an integer ≥ {lowest}, got {value!r}", param=key)
    return int(value)


def _bool(data: dict[str, Any], key: str) -> bool:
    value = data.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise OpenAIError(400, f"{key} must be true or false, got {value!r}", param=key)
    return value


def _stream_options(data: dict[str, Any], stream: bool) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise OpenAIError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    if not isinstance(options, dict):
        raise OpenAIError(400, f"stream_options must be an object, got {options!r}", param="stream_options")
    return _bool(options, "include_usage")


def _prompt_tokens(prompt: Any, counter: TokenCounter) -> int:
    """A string is counted; a list of token ids is its length; a list of one of either is that one."""
    if isinstance(prompt, str):
        return counter.text(prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return _prompt_tokens(prompt[0], counter)
    if prompt is None:
        raise OpenAIError(400, "prompt is required", param="prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise OpenAIError(400, f"a batch of {len(prompt)} prompts is not served: send one prompt per request",
                          param="prompt")
    raise OpenAIError(400, "prompt must be a string, a list of token ids, or a list holding one of either",
                      param="prompt")


def _messages(messages: Any) -> list[dict[str, str]]:
    """Each message as {role, content[, name]} with its text parts joined."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError(400, f"messages[{i}] must be an object with a string role", param="messages")
        text = _content_text(message.get("content"), i)
        entry = {"role": message["role"], "content": text}
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        out.append(entry)
    return out


def _content_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(400, f"messages[{index}].content: only text parts ({{type: text, text}}) are "
                                       "served", param="messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise OpenAIError(400, f"messages[{index}].content must be a string, null or a list of text parts",
                      param="messages")


# -- responses --------------------------------------------------------------------------------------------------


def models_body(limits: Limits, created: int) -> dict[str, Any]:
    """GET /v1/models (vLLM adds max_model_len; so do we)."""
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY, "root": name, "parent": None,
         "max_model_len": limits.context_tokens} for name in limits.models]}


def _usage(job: Job, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": job.prompt_tokens + completion_tokens}


def _object(job: Job, *, chunk: bool) -> str:
    if job.kind == "chat":
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def finish_reason(job: Job, completion_tokens: int) -> str | None:
    """"length": the request ran to its limit (every complete one does: there is no end-of-sequence token)."""
    return "length" if completion_tokens >= job.max_tokens else None


def response_body(job: Job, response_id: str, created: int, completion_tokens: int) -> dict[str, Any]:
    """The non-streamed answer: every token's text at once, and the usage."""
    text = FILLER_WORD * completion_tokens
    reason = finish_reason(job, completion_tokens)
    if job.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                                  "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    return {"id": response_id, "object": _object(job, chunk=False), "created": created, "model": job.model,
            "choices": [choice], "usage": _usage(job, completion_tokens)}


def token_chunk(job: Job, response_id: str, created: int, index: int) -> dict[str, Any]:
    """The streamed chunk of output token `index` (0-based): one token of text; the last one says why it ended.
    A chat stream's first chunk also carries the role, so no content-less chunk comes before the first token
    (a tool that times its first chunk times the first token)."""
    reason = finish_reason(job, index + 1)
    if job.kind == "chat":
        delta = {"role": "assistant", "content": FILLER_WORD} if index == 0 else {"content": FILLER_WORD}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": FILLER_WORD, "logprobs": None, "finish_reason": reason}
    chunk = {"id": response_id, "object": _object(job, chunk=True), "created": created, "model": job.model,
             "choices": [choice]}
    if job.include_usage:  # OpenAI: with include_usage every chunk has usage, null but in the last one
        chunk["usage"] = None
    return chunk


def usage_chunk(job: Job, response_id: str, created: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk with `stream_options.include_usage`: no choices, the usage of the whole request."""
    return {"id": response_id, "object": _object(job, chunk=True), "created": created, "model": job.model,
            "choices": [], "usage": _usage(job, completion_tokens)}


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying `data` as JSON."""
    return b"data: " + json.dumps(data, separators=(",", ":"), allow_nan=False).encode() + b"\n\n"
