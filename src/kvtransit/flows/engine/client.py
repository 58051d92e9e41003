"""The run's client of the vLLM instances: OpenAI completions over HTTP on loopback, timed at the client.

Blocking `http.client` (the harness calls it through `asyncio.to_thread`): one request at a time, as a person
measuring TTFT and TPOT would send them. A streamed completion is timed token by token as its server-sent events
arrive (`time.monotonic_ns`, the clock every kvtransit process stamps with, so the client's times line up with the
connector's and the middlebox's); a teacher-forced one asks for the prompt's log-probabilities instead.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

REQUEST_TIMEOUT_S = 300.0  # one completion on a 2-core CPU: seconds; a stuck engine is found within this


@dataclass
class Completion:
    """One completion as the client saw it: what came, when, and how it ended."""

    sent_ns: int
    token_ids: list[int] = field(default_factory=list)
    token_ns: list[int] = field(default_factory=list)  # when each token's event arrived
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None  # the server's error, if the request failed
    prompt_logprobs: list[dict[str, float] | None] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        return (self.token_ns[0] - self.sent_ns) / 1e9 if self.token_ns else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time between output tokens after the first (vLLM's definition of TPOT)."""
        if len(self.token_ns) < 2:
            return None
        return (self.token_ns[-1] - self.token_ns[0]) / 1e9 / (len(self.token_ns) - 1)


def _connection(port: int) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)


def complete(port: int, body: dict[str, Any]) -> Completion:
    """A streamed completion (`body` as vLLM's /v1/completions takes it; "stream" and token ids are asked here)."""
    body = {**body, "stream": True, "return_token_ids": True}
    connection = _connection(port)
    done = Completion(sent_ns=time.monotonic_ns())
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            done.error = f"HTTP {response.status}: {response.read().decode(errors='replace')[:300]}"
            return done
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                done.error = str(event["error"].get("message", event["error"]))[:300]
                break
            stamp = time.monotonic_ns()
            for choice in event.get("choices", []):
                ids = choice.get("token_ids") or []
                done.token_ids.extend(ids)
                done.token_ns.extend([stamp] * len(ids))
                done.text += choice.get("text") or ""
                done.finish_reason = choice.get("finish_reason") or done.finish_reason
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        done.error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    if done.error is None and done.finish_reason == "error":
        done.error = "the engine ended the request with an error"
    return done


def prompt_logprobs(port: int, body: dict[str, Any], top: int) -> Completion:
    """A completion of one token whose answer carries each prompt position's `top` log-probabilities."""
    body = {**body, "max_tokens": 1, "prompt_logprobs": top, "return_token_ids": True}
    connection = _connection(port)
    done = Completion(sent_ns=time.monotonic_ns())
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read().decode(errors="replace")
        if response.status != 200:
            done.error = f"HTTP {response.status}: {payload[:300]}"
            return done
        choice = json.loads(payload)["choices"][0]
        done.finish_reason = choice.get("finish_reason")
        done.prompt_logprobs = [None if p is None else {k: float(v["logprob"]) if isinstance(v, dict) else float(v)
                                                        for k, v in p.items()}
                                for p in choice.get("prompt_logprobs") or []]
    except (OSError, http.client.HTTPException, json.JSONDecodeError, KeyError, IndexError) as exc:
        done.error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    if done.error is None and done.finish_reason == "error":
        done.error = "the engine ended the request with an error"
    return done


def healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def finite(value: float) -> bool:
    return math.isfinite(value)
