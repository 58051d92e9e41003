"""The OpenAI front end, live (`kvtransit up --frontend`): the official `openai` client drives a whole run.

One run for the module (`served`): a launcher with the front end in the load generator's place and a request
count of REQUESTS; a client session streams and fetches completions and chats, sends every kind of bad input,
walks away from two requests mid-answer, and asks once past the count. The tests then read what the client saw
beside the run's own report and ledger. Timing is compared relatively (a busy 2-core box), never asserted fast.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvtransit.harness.up.agent_commands import FrontendOptions
from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.judge import ledger_check as ledger
from kvtransit.model.scenario import Scenario

openai = pytest.importorskip("openai", reason="the `openai` client is in the test extra: pip install -e '.[test]'")

pytestmark = pytest.mark.timeout(180)

STREAM_TOKENS = 12
# 12,000 prompt tokens (bytes/4): a prefill of a few hundred ms, so a client's own overhead (request building, the
# SSE parse: a few ms) is small beside the TTFT it measures.
LONG_PROMPT = "abcd" * 12_000
REQUESTS = 7  # the requests the session below gets admitted; the run ends after them
# A client measures from before its call, the report from when the front end had the request: the client's TTFT
# is the larger, by its own overhead, a small share of a long prefill even on a loaded 2-core box.
TTFT_TOLERANCE = 0.25
ITL_TOLERANCE = 0.25


@dataclass
class Session:
    url: str
    model: str
    stream_times_s: list[float] = field(default_factory=list)
    stream_text: list[str] = field(default_factory=list)
    stream_usage: Any = None
    stream_finish: list[str | None] = field(default_factory=list)
    stream_id: str = ""
    whole: Any = None
    chat_stream_deltas: list[dict] = field(default_factory=list)
    chat_stream_usage: Any = None
    chat_whole: Any = None
    models: Any = None
    errors: dict[str, tuple[int, dict]] = field(default_factory=dict)
    past_the_count: tuple[int, dict] | None = None
    gone_ids: list[str] = field(default_factory=list)


async def _raw_post(url: str, path: str, body: bytes) -> tuple[int, dict]:
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


async def _error(call) -> tuple[int, dict]:
    try:
        await call
    except openai.APIStatusError as exc:
        return exc.status_code, exc.body
    raise AssertionError("the request was served, not refused")


async def _session(url: str, model: str) -> Session:
    session = Session(url, model)
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    session.models = await client.models.list()  # also warms the client: its first call loads modules

    # Every kind of bad input: refused before the testbed sees anything (none counts towards REQUESTS).
    session.errors["malformed json"] = await _raw_post(url, "/v1/completions", b'{"model": "x", "prompt": ')
    session.errors["unknown model"] = await _error(client.completions.create(model="gpt-9", prompt="hi", max_tokens=2))
    session.errors["max_tokens 0"] = await _error(client.completions.create(model=model, prompt="hi", max_tokens=0))
    session.errors["max_tokens -5"] = await _error(client.completions.create(model=model, prompt="hi", max_tokens=-5))
    session.errors["past the context"] = await _error(client.completions.create(model=model, prompt="hi",
                                                                                max_tokens=40_000))
    session.errors["chat unknown model"] = await _error(client.chat.completions.create(
        model="gpt-9", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=2))
    session.errors["chat max_completion_tokens 0"] = await _error(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=0))
    session.errors["stream_options without stream"] = await _error(client.completions.create(
        model=model, prompt="hi", max_tokens=2, stream_options={"include_usage": True}))

    # 1: a streamed completion, timed by the client.
    t0 = time.perf_counter()
    stream = await client.completions.create(model=model, prompt=LONG_PROMPT, max_tokens=STREAM_TOKENS, stream=True,
                                             stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices:
            session.stream_times_s.append(time.perf_counter() - t0)
            session.stream_text.append(chunk.choices[0].text)
            session.stream_finish.append(chunk.choices[0].finish_reason)
            session.stream_id = chunk.id
        if chunk.usage is not None:
            session.stream_usage = chunk.usage
    # 2, 3, 4: whole, chat streamed, chat whole.
    session.whole = await client.completions.create(model=model, prompt="abcdefgh", max_tokens=5)
    chat_stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_completion_tokens=6, stream=True,
        stream_options={"include_usage": True})
    async for chunk in chat_stream:
        if chunk.choices:
            session.chat_stream_deltas.append(chunk.choices[0].delta.model_dump(exclude_none=True))
        if chunk.usage is not None:
            session.chat_stream_usage = chunk.usage
    session.chat_whole = await client.chat.completions.create(
        model=model, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=3)

    # 5: a streamed client that leaves after two tokens.
    leaving = await client.completions.create(model=model, prompt="x", max_tokens=400, stream=True)
    seen = 0
    async for chunk in leaving:
        session.gone_ids.append(chunk.id)
        seen += 1
        if seen == 2:
            break
    await leaving.close()
    # 6: a client waiting for a whole answer that leaves before it comes.
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    _reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"model": model, "prompt": "x", "max_tokens": 400}).encode()
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    await asyncio.sleep(0.5)  # admitted and in decode by now: the client goes mid-answer
    writer.close()

    # 7: the last request the run takes; while it streams, one more is refused.
    last = await client.completions.create(model=model, prompt="x", max_tokens=100, stream=True)
    async for _chunk in last:
        if session.past_the_count is None:
            session.past_the_count = await _error(client.completions.create(model=model, prompt="x", max_tokens=2))
    await client.close()
    return session


@dataclass
class Served:
    session: Session
    report: dict
    ledger: list[dict]
    log: list[str]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    tmp = tmp_path_factory.mktemp("frontend")
    scenario = Scenario(codec="none")
    log: list[str] = []
    launcher = Launcher(scenario, figures=False, report_path=tmp / "run.json", drain_timeout_s=30.0, log=log.append,
                        frontend=FrontendOptions(listen="127.0.0.1:0", max_requests=REQUESTS, tokenizer="bytes"))

    async def main() -> tuple[Session, Path | None]:
        run = asyncio.create_task(launcher.run())
        while launcher.frontend_url is None:  # announced once the front end printed its readiness line
            if run.done():
                await run  # a start-up failure: raise it here
            await asyncio.sleep(0.05)  # polling the launcher's state: no model time
        session = await _session(launcher.frontend_url, scenario.model)
        return session, await asyncio.wait_for(run, 120)  # the run ends by itself after REQUESTS requests

    session, path = asyncio.run(main())
    assert path is not None
    records = ledger.parse((tmp / "run.run" / ledger.LEDGER_FILE).read_text().splitlines(keepends=True))
    return Served(session, json.loads(path.read_text()), records, log)


def _request_id(response_id: str) -> int:
    return int(response_id.rsplit("-", 1)[1])


def _per_request(served: Served, response_id: str) -> dict:
    rid = _request_id(response_id)
    return next(r for r in served.report["per_request"] if r["id"] == rid)


def test_the_launcher_announces_the_front_ends_url_and_how_the_run_ends(served):
    line = next(line for line in served.log if "OpenAI-compatible front end at" in line)
    assert served.session.url in line and f"after {REQUESTS} requests" in line


def test_models_lists_the_served_model(served):
    assert [m.id for m in served.session.models.data] == [served.session.model]


def test_a_streamed_completion_yields_one_token_per_chunk_for_max_tokens(served):
    session = served.session
    assert len(session.stream_times_s) == STREAM_TOKENS
    assert "".join(session.stream_text) == " the" * STREAM_TOKENS
    assert session.stream_finish == [None] * (STREAM_TOKENS - 1) + ["length"]


def test_the_streams_usage_matches_what_was_asked_and_delivered(served):
    usage = served.session.stream_usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (len(LONG_PROMPT) // 4, STREAM_TOKENS, len(LONG_PROMPT) // 4 + STREAM_TOKENS)
    row = _per_request(served, served.session.stream_id)
    assert (row["prompt_tokens"], row["output_tokens"]) == (usage.prompt_tokens, STREAM_TOKENS)


def test_the_clients_ttft_is_the_reports_ttft_for_that_request(served):
    client_ttft = served.session.stream_times_s[0]
    report_ttft = _per_request(served, served.session.stream_id)["ttft_s"] * served.report["config"][
        "effective_dilation"]
    assert report_ttft <= client_ttft  # the client asked before the front end had its request
    assert client_ttft == pytest.approx(report_ttft, rel=TTFT_TOLERANCE)


def test_the_clients_inter_token_gaps_average_to_the_reports_tpot(served):
    times = served.session.stream_times_s
    client_itl = (times[-1] - times[0]) / (len(times) - 1)
    report_tpot = _per_request(served, served.session.stream_id)["tpot_s"] * served.report["config"][
        "effective_dilation"]
    assert client_itl == pytest.approx(report_tpot, rel=ITL_TOLERANCE)


def test_a_whole_completion_holds_max_tokens_tokens_and_its_usage(served):
    whole = served.session.whole
    assert whole.object == "text_completion" and whole.choices[0].text == " the" * 5
    assert whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (2, 5, 7)


def test_a_chat_streams_its_tokens_with_the_role_first_and_its_usage_last(served):
    deltas = served.session.chat_stream_deltas
    assert len(deltas) == 6
    assert deltas[0] == {"role": "assistant", "content": " the"}
    assert all(d == {"content": " the"} for d in deltas[1:])
    assert served.session.chat_stream_usage.completion_tokens == 6


def test_a_whole_chat_answer_is_an_assistant_message_of_max_tokens_tokens(served):
    answer = served.session.chat_whole
    assert answer.object == "chat.completion"
    assert (answer.choices[0].message.role, answer.choices[0].message.content) == ("assistant", " the" * 3)
    assert answer.usage.completion_tokens == 3 and answer.usage.prompt_tokens > 0


@pytest.mark.parametrize("case,param,code", [
    ("malformed json", None, None),
    ("unknown model", "model", "model_not_found"),
    ("max_tokens 0", "max_tokens", None),
    ("max_tokens -5", "max_tokens", None),
    ("past the context", "max_tokens", "context_length_exceeded"),
    ("chat unknown model", "model", "model_not_found"),
    ("chat max_completion_tokens 0", "max_completion_tokens", None),
    ("stream_options without stream", "stream_options", None),
])
def test_bad_input_is_a_400_in_openais_error_shape(served, case, param, code):
    status, body = served.session.errors[case]
    assert status == 400
    error = body.get("error", body)  # the client hands over the error object itself
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert error["message"]


def test_a_client_that_leaves_mid_answer_fails_its_request_as_client_gone(served):
    gone = [r for r in served.report["per_request"] if r["failure"] == "client gone"]
    assert _request_id(served.session.gone_ids[0]) in {r["id"] for r in gone}
    assert len(gone) == 2  # the streamed one and the whole one
    assert served.report["requests"]["failed_reasons"] == {"client gone": 2}
    assert served.report["frontend"]["client_gone"] == 2
    outcomes = [r for r in served.ledger if r["ev"] == "outcome" and r["reason"] == "client gone"]
    assert sorted(r["id"] for r in outcomes) == sorted(r["id"] for r in gone)


def test_the_run_takes_its_count_then_refuses_with_503_and_ends_by_itself(served):
    status, body = served.session.past_the_count
    error = body.get("error", body)
    assert status == 503 and error["code"] == "run_over"
    assert served.report["requests"]["total"] == REQUESTS
    assert served.report["workload"]["source"] == "openai-frontend"
    assert served.report["workload"]["requests"] == REQUESTS


def test_every_request_from_outside_is_in_the_ledger_which_reconciles(served):
    verdict = ledger.check(served.ledger)
    assert verdict.ok, verdict.problems()
    assert verdict.requests == REQUESTS
    assert {r["id"] for r in served.ledger if r["ev"] == "sent"} == set(range(REQUESTS))
    assert served.report["requests"]["ok"] + served.report["requests"]["slo_miss"] == REQUESTS - 2


def test_the_runs_summary_under_vllms_keys_holds_what_the_client_saw(served, tmp_path):
    from kvtransit.cli.up import write_vllm_result

    result = json.loads(write_vllm_result(served.report, tmp_path / "run.json").read_text())
    assert (result["num_prompts"], result["completed"], result["failed"]) == (REQUESTS, REQUESTS - 2, 2)
    assert result["model_id"] == served.session.model and result["request_rate"] is None
    assert result["tokenizer_id"] == "bytes/4"
    client_ttfts_ms = served.session.stream_times_s[0] * 1e3
    assert result["mean_ttft_ms"] <= client_ttfts_ms  # the long prompt's TTFT is the largest of the run
