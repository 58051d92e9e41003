"""The OpenAI API sans I/O (agents/frontend/openai_protocol.py): what a request body becomes, what is refused
with which OpenAI-shaped 400, and the shape of every answer and stream chunk."""

from __future__ import annotations

import json

import pytest

from kvtransit.agents.frontend import openai_protocol as api
from kvtransit.agents.frontend.openai_protocol import Job, Limits, OpenAIError
from kvtransit.agents.frontend.prompt_tokens import ByteEstimate

LIMITS = Limits(("llama3-8b",), context_tokens=1000)
COUNT = ByteEstimate()


def completion(**body) -> Job:
    return api.parse_completion(json.dumps({"model": "llama3-8b", "prompt": "abcdefgh", **body}).encode(), COUNT,
                                LIMITS)


def chat(**body) -> Job:
    return api.parse_chat(json.dumps({"model": "llama3-8b", "messages": [{"role": "user", "content": "hi"}],
                                      **body}).encode(), COUNT, LIMITS)


def refused(parse, body: bytes) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        parse(body, COUNT, LIMITS)
    return caught.value


def test_a_completion_asks_the_testbed_for_the_prompts_tokens_and_max_tokens():
    job = completion(max_tokens=7, stream=True, stream_options={"include_usage": True})
    assert (job.kind, job.prompt_tokens, job.max_tokens, job.stream, job.include_usage) == ("completion", 2, 7, True,
                                                                                            True)


def test_a_prompt_of_token_ids_is_as_long_as_the_list():
    assert completion(prompt=[5, 6, 7, 8, 9]).prompt_tokens == 5
    assert completion(prompt=[[5, 6, 7]]).prompt_tokens == 3
    assert completion(prompt=["abcdefghijkl"]).prompt_tokens == 3


def test_max_tokens_defaults_to_16_for_completions_and_to_the_rest_of_the_context_for_chat():
    assert completion().max_tokens == api.COMPLETIONS_DEFAULT_MAX_TOKENS
    job = chat()
    assert job.max_tokens == LIMITS.context_tokens - job.prompt_tokens


def test_chat_takes_max_completion_tokens_over_max_tokens():
    assert chat(max_tokens=5).max_tokens == 5
    assert chat(max_tokens=5, max_completion_tokens=9).max_tokens == 9


def test_chat_prompt_tokens_count_every_message_and_its_framing():
    one = chat().prompt_tokens
    job = api.parse_chat(json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
                                    ).encode(), COUNT, LIMITS)
    assert job.prompt_tokens == one + ByteEstimate().chat([{"role": "system", "content": "be brief"}]) \
        - ByteEstimate().chat([])


def test_a_request_naming_no_model_gets_the_served_one_as_vllm_does():
    job = api.parse_completion(b'{"prompt": "abcd", "max_tokens": 1}', COUNT, LIMITS)
    assert job.model == "llama3-8b"


def test_ignore_eos_and_min_tokens_are_accepted_within_max_tokens():
    job = completion(max_tokens=8, ignore_eos=True, min_tokens=8)
    assert (job.ignore_eos, job.min_tokens, job.max_tokens) == (True, 8, 8)


@pytest.mark.parametrize("body,param,code,fragment", [
    (b"{not json", None, None, "not valid JSON"),
    (b"[1, 2]", None, None, "must be a JSON object"),
    (b'{"model": "gpt-9", "prompt": "x"}', "model", "model_not_found", "gpt-9"),
    (b'{"prompt": "x", "max_tokens": 0}', "max_tokens", None, "at least 1"),
    (b'{"prompt": "x", "max_tokens": -3}', "max_tokens", None, "at least 1"),
    (b'{"prompt": "x", "max_tokens": 2.5}', "max_tokens", None, "integer"),
    (b'{"prompt": "x", "max_tokens": true}', "max_tokens", None, "integer"),
    (b'{"prompt": "x", "max_tokens": 1000}', "max_tokens", "context_length_exceeded", "maximum context length is 1000"),
    (b'{"prompt": [1], "max_tokens": 999}', None, None, None),  # exactly the context: served
    (b'{"prompt": "' + b"a" * 4000 + b'"}', "prompt", "context_length_exceeded", "no room"),
    (b'{"prompt": ""}', "prompt", None, "empty"),
    (b'{"max_tokens": 3}', "prompt", None, "required"),
    (b'{"prompt": ["a", "b"]}', "prompt", None, "batch of 2"),
    (b'{"prompt": {"text": "a"}}', "prompt", None, "string, a list of token ids"),
    (b'{"prompt": "x", "stream_options": {"include_usage": true}}', "stream_options", None, "stream=True"),
    (b'{"prompt": "x", "stream": "yes"}', "stream", None, "true or false"),
    (b'{"prompt": "x", "n": 2}', "n", None, "n must be 1"),
    (b'{"prompt": "x", "max_tokens": 4, "min_tokens": 5}', "min_tokens", None, "max_tokens=4"),
])
def test_a_bad_completion_request_is_a_400_in_openais_error_shape(body, param, code, fragment):
    if fragment is None:
        assert api.parse_completion(body, COUNT, LIMITS).max_tokens == 999
        return
    error = refused(api.parse_completion, body)
    assert error.status == 400
    assert error.body() == {"error": {"message": error.message, "type": "invalid_request_error", "param": param,
                                      "code": code}}
    assert fragment in error.message


@pytest.mark.parametrize("body,fragment", [
    (b'{"messages": []}', "non-empty list"),
    (b'{"messages": "hi"}', "non-empty list"),
    (b'{"messages": [{"content": "hi"}]}', "string role"),
    (b'{"messages": [{"role": "user", "content": 5}]}', "string, null or a list"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "only text parts"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}', "at least 1"),
])
def test_a_bad_chat_request_is_a_400_naming_what_was_wrong(body, fragment):
    error = refused(api.parse_chat, body)
    assert error.status == 400 and fragment in error.message


def test_a_whole_completion_holds_every_token_and_the_usage():
    job = completion(max_tokens=3)
    body = api.response_body(job, "cmpl-1", 1700000000, 3)
    assert body["object"] == "text_completion" and body["model"] == "llama3-8b"
    assert body["choices"] == [{"index": 0, "text": api.FILLER_WORD * 3, "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_a_whole_chat_answer_is_an_assistant_message():
    body = api.response_body(chat(max_tokens=2), "chatcmpl-1", 1, 2)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": api.FILLER_WORD * 2}


def test_each_stream_chunk_carries_one_token_and_the_last_says_length():
    job = completion(max_tokens=3, stream=True)
    chunks = [api.token_chunk(job, "cmpl-1", 1, i) for i in range(3)]
    assert [c["choices"][0]["text"] for c in chunks] == [api.FILLER_WORD] * 3
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert all("usage" not in c for c in chunks)  # only with include_usage


def test_a_chat_stream_gives_the_role_with_the_first_token_not_before_it():
    job = chat(max_tokens=2, stream=True, stream_options={"include_usage": True})
    first, second = (api.token_chunk(job, "c", 1, i) for i in range(2))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": api.FILLER_WORD}
    assert second["choices"][0]["delta"] == {"content": api.FILLER_WORD}
    assert first["object"] == "chat.completion.chunk" and first["usage"] is None


def test_the_usage_chunk_has_no_choices_and_the_whole_requests_counts():
    job = completion(max_tokens=4, stream=True, stream_options={"include_usage": True})
    chunk = api.usage_chunk(job, "cmpl-1", 1, 4)
    assert chunk["choices"] == [] and chunk["usage"]["completion_tokens"] == 4


def test_server_sent_events_are_data_lines_ending_in_a_blank_line():
    assert api.sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert api.SSE_DONE == b"data: [DONE]\n\n"


def test_models_lists_the_served_model_with_its_context():
    body = api.models_body(LIMITS, 5)
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [("llama3-8b", "model", 1000)]


def test_errors_the_http_layer_answers_take_the_same_shape():
    assert api.http_error_body(404, "no route /x") == {"error": {"message": "no route /x", "type": "not_found_error",
                                                                 "param": None, "code": None}}
