"""A client that leaves mid-stream withdraws its request from the testbed (`kvtransit up --frontend`, live).

One run (`left`): the official `openai` client streams a completion of LONG_OUTPUT tokens and closes the stream
after LEFT_AFTER of them; a second, short completion is the run's last request. Without the withdrawal decode would
still be decoding the first (its thousands of tokens take far longer than the run): the report's agents' /stats,
read at the run's end, show it out of decode's batch with its KV reservation freed, decode having made far fewer
tokens than asked; the ledger ends it once, "failed: client gone".
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvtransit.harness.up.agent_commands import FrontendOptions
from kvtransit.harness.up.launcher import Launcher
from kvtransit.model.judge import ledger_check as ledger
from kvtransit.model.scenario import Scenario

openai = pytest.importorskip("openai", reason="the `openai` client is in the test extra: pip install -e '.[test]'")

pytestmark = pytest.mark.timeout(180)

LONG_OUTPUT = 4000  # ~4000 decode steps: tens of seconds had it run on, far past this run's end
LEFT_AFTER = 3
SHORT_OUTPUT = 4


@dataclass
class Left:
    leaving_id: int
    seen: int
    report: dict
    ledger: list[dict]


def _request_id(response_id: str) -> int:
    return int(response_id.rsplit("-", 1)[1])


async def _session(url: str, model: str) -> tuple[int, int]:
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    stream = await client.completions.create(model=model, prompt="x", max_tokens=LONG_OUTPUT, stream=True)
    seen, response_id = 0, ""
    async for chunk in stream:
        response_id = chunk.id
        seen += 1
        if seen == LEFT_AFTER:
            break
    await stream.close()  # the client goes: its connection closes mid-answer
    # Decode's steps go on for the others: this one's answer comes whole (and ends the run, its last request).
    await client.completions.create(model=model, prompt="abcd", max_tokens=SHORT_OUTPUT)
    await client.close()
    return _request_id(response_id), seen


@pytest.fixture(scope="module")
def left(tmp_path_factory) -> Left:
    tmp = tmp_path_factory.mktemp("client-gone")
    scenario = Scenario(codec="none")
    launcher = Launcher(scenario, report_path=tmp / "run.json", drain_timeout_s=30.0, log=lambda _line: None,
                        figures=False,
                        frontend=FrontendOptions(listen="127.0.0.1:0", max_requests=2, tokenizer="bytes"))

    async def main() -> tuple[tuple[int, int], Path | None]:
        run = asyncio.create_task(launcher.run())
        while launcher.frontend_url is None:  # announced once the front end printed its readiness line
            if run.done():
                await run  # a start-up failure: raise it here
            await asyncio.sleep(0.05)  # polling the launcher's state: no model time
        session = await _session(launcher.frontend_url, scenario.model)
        return session, await asyncio.wait_for(run, 120)

    (leaving_id, seen), path = asyncio.run(main())
    assert path is not None
    records = ledger.parse((tmp / "run.run" / ledger.LEDGER_FILE).read_text().splitlines(keepends=True))
    return Left(leaving_id, seen, json.loads(path.read_text()), records)


def _agent(left: Left, role: str) -> dict:
    (stats,) = [s for s in left.report["run"]["agents"] if s.get("role") == role]
    return stats


def test_decode_took_the_withdrawn_request_out_of_its_batch_and_freed_its_reservation(left):
    decode = _agent(left, "decode")
    assert decode["cancelled"] == {"batch": 1, "before_kv": 0}
    assert decode["batch"] == {"waiting": 0, "running": 0, "kv_reserved_tokens": 0}


def test_decode_made_far_fewer_tokens_than_the_client_had_asked_for(left):
    decode = _agent(left, "decode")
    asked = (LONG_OUTPUT - 1) + (SHORT_OUTPUT - 1)  # decode makes every token but the first (prefill's)
    assert decode["tokens"] < asked / 2
    decode_tokens_of_left = [index for r in left.ledger if r["ev"] == "tokens" and r["src"].startswith("decode")
                             for rid, index in r["entries"] if rid == left.leaving_id]
    assert len(decode_tokens_of_left) < LONG_OUTPUT / 2


def test_the_ledger_ends_the_withdrawn_request_once_as_failed_client_gone(left):
    assert left.seen == LEFT_AFTER
    outcomes = [r for r in left.ledger if r["ev"] == "outcome" and r["id"] == left.leaving_id]
    assert [(r["outcome"], r["reason"]) for r in outcomes] == [("failed", "client gone")]
    verdict = ledger.check(left.ledger)
    assert verdict.ok, verdict.problems()
    assert verdict.failed_reasons == {"client gone": 1} and verdict.requests == 2
    assert left.report["frontend"]["client_gone"] == 1


def test_the_prefill_had_nothing_left_to_withdraw_once_decode_held_the_kv(left):
    prefill = _agent(left, "prefill")
    assert prefill["cancelled"] == {"queued": 0, "handoff": 0} and prefill["held_requests"] == 0
