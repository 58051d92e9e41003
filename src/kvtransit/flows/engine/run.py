"""`kvtransit engine`'s run: real vLLM instances, the middlebox between them, the same prompts with each kernel.

1. **The reference.** A single vLLM instance (no connector) generates each prompt's continuation, greedy. It is
   then stopped: the host has two cores.
2. **The hand-off.** A prefill and a decode instance (kvtransit's connector, vllm_connector.py) start, each on a
   core of its own; then, for each kernel in turn, a middlebox (`kvtransit middlebox`, the scenario's link,
   kernel, scale and dilation) between them. Each prompt goes to the prefill instance for its first token (its
   KV goes out to the middlebox as the forward ends), then to the decode instance, which loads the KV that came
   through the link into its paged cache and generates the rest. TTFT and TPOT are measured at the client;
   the hand-off on the wire (the connector's records: first token at the prefill → KvEnd at decode).
3. **Teacher-forced scoring** (`--scored-tokens M`): the prompt's KV crosses the link again, and the decode
   instance is given the prompt + the reference's first M tokens, its KV only for the prompt: the M positions are
   computed over the KV that crossed, and their full next-token distributions (vLLM's prompt log-probabilities,
   every token of the vocabulary) are compared with the same positions under kernel none: top-1 agreement and
   KL(none || kernel), nats per token, as `kvtransit accuracy` measures them.
4. **A corrupted block** (`--corrupt-check`): with the middlebox's `corrupt` fault on (a bit flipped after the
   frame's CRC was computed), one more prompt: its stream breaks at decode's CRC check, the decode instance fails
   the request with the reason, and nothing of it is loaded.

Every process it starts is stopped by the end, on error too (instances.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtransit.flows.engine import client
from kvtransit.flows.engine.engine_report import build_report
from kvtransit.flows.engine.instances import Instance, InstanceSpec, src_root
from kvtransit.flows.engine.vllm_extra import Engine
from kvtransit.harness.children import Child
from kvtransit.harness.up.prometheus import free_port
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import Scenario
from kvtransit.realmodel.texts import Window, read_text
from kvtransit.runtime import http_client

MIDDLEBOX_READY_S = 60.0  # it dials decode's KV ingress first; the decode instance is up by then
ACK_WAIT_S = 10.0  # a hand-off's records are written when its Ack comes back: wait this long after the decode


@dataclass(frozen=True)
class EngineRun:
    """What `kvtransit engine` was asked to run."""

    scenario: Scenario  # the link, the kernel's parameters, scale and dilation the middlebox runs
    kernels: tuple[str, ...]  # on the link in turn; "none" first (the reference for KL)
    windows: tuple[Window, ...]  # the prompts: a window of a text, `context` tokens each
    output_tokens: int
    scored_tokens: int  # teacher-forced positions per prompt (0: none)
    corrupt_check: bool
    model_dir: str
    engine: Engine
    out_dir: Path

    @property
    def max_model_len(self) -> int:
        return max(w.context for w in self.windows) + max(self.output_tokens, self.scored_tokens) + 8


@dataclass
class Measured:
    """Everything the run saw, by phase; engine_report.py turns it into the report."""

    startup_s: dict[str, float] = field(default_factory=dict)
    prompts: list[dict[str, Any]] = field(default_factory=list)  # name, token ids
    reference: list[dict[str, Any]] = field(default_factory=list)  # per prompt: the single instance's completion
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)  # per kernel: per-prompt rows, middlebox stats
    corrupt: dict[str, Any] | None = None
    records: list[dict[str, Any]] = field(default_factory=list)  # the connectors' per-request records


def _completion_row(done: client.Completion) -> dict[str, Any]:
    return {"token_ids": done.token_ids, "text": done.text, "ttft_s": done.ttft_s, "tpot_s": done.tpot_s,
            "error": done.error, "finish_reason": done.finish_reason, "sent_ns": done.sent_ns,
            "first_token_ns": done.token_ns[0] if done.token_ns else None}


def _body(run: EngineRun, prompt: list[int], max_tokens: int, wire_id: int | None = None,
          kv_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": run.model_dir, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                            "ignore_eos": True}
    if wire_id is not None:
        params: dict[str, Any] = {"kvtransit_id": wire_id}
        if kv_tokens is not None:
            params["kvtransit_tokens"] = kv_tokens
        body["kv_transfer_params"] = params
    return body


async def _tokenize(port: int, text: str) -> list[int]:
    answer = await http_client.request("127.0.0.1", port, "POST", "/tokenize",
                                       http_client.json_body({"prompt": text, "add_special_tokens": False}),
                                       headers={"Content-Type": "application/json"}, timeout_s=60.0)
    if answer.status != 200:
        raise ConfigError(f"the vLLM instance refused to tokenize a prompt: HTTP {answer.status}")
    return list(answer.json()["tokens"])


class EngineRunner:
    def __init__(self, run: EngineRun):
        self.run = run
        self.measured = Measured()
        self._instances: list[Instance] = []
        self._middlebox: Child | None = None
        self._next_id = 1
        run.out_dir.mkdir(parents=True, exist_ok=True)
        self.records = {side: run.out_dir / f"{side}-records.jsonl" for side in ("prefill", "decode")}
        for path in self.records.values():
            path.unlink(missing_ok=True)

    def _wire_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def go(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            await self._reference()
            await self._handoffs()
        finally:
            await self._stop_all()
        for side, path in self.records.items():
            if path.exists():
                self.measured.records += [dict(json.loads(line), side=side) for line in path.read_text().splitlines()]
        return build_report(self.run, self.measured, wall_s=time.monotonic() - started)

    # -- the processes ----------------------------------------------------------------------------------------

    async def _start(self, specs: list[InstanceSpec]) -> list[Instance]:
        instances = [Instance(self.run.engine.python, self.run.model_dir, spec, self.run.max_model_len)
                     for spec in specs]
        self._instances += instances
        for instance in instances:
            await instance.start()
        for instance in instances:
            self.measured.startup_s[instance.spec.role] = round(await instance.wait_healthy(), 1)
        return instances

    async def _stop(self, instance: Instance) -> None:
        await instance.stop()
        self._instances.remove(instance)

    async def _stop_middlebox(self) -> dict[str, Any] | None:
        child, self._middlebox = self._middlebox, None
        if child is None:
            return None
        stats = None
        with contextlib.suppress(OSError, TimeoutError, ValueError, http_client.HttpStatusError):
            stats = await http_client.get_json(child.host, child.ready_info["metrics_port"], "/stats")
        await child.stop()
        return stats

    async def _stop_all(self) -> None:
        with contextlib.suppress(Exception):
            await self._stop_middlebox()
        for instance in list(self._instances):
            with contextlib.suppress(Exception):
                await self._stop(instance)

    # -- 1. the reference -------------------------------------------------------------------------------------

    async def _reference(self) -> None:
        run = self.run
        (single,) = await self._start([InstanceSpec("single", free_port(), "0")])
        texts: dict[str, list[int]] = {}
        for window in run.windows:
            if window.text not in texts:
                texts[window.text] = await _tokenize(single.spec.port, read_text(window.text))
            ids = texts[window.text][window.offset:window.offset + window.context]
            if len(ids) < window.context:
                raise ConfigError(f"prompt {window.name}: {window.text} has {len(texts[window.text])} tokens, the "
                                  f"window needs {window.offset + window.context}")
            self.measured.prompts.append({"name": window.name, "token_ids": ids})
        for prompt in self.measured.prompts:
            done = await asyncio.to_thread(client.complete, single.spec.port,
                                           _body(run, prompt["token_ids"], run.output_tokens))
            if done.error:
                raise ConfigError(f"the single vLLM instance failed prompt {prompt['name']}: {done.error}")
            self.measured.reference.append(_completion_row(done))
        await self._stop(single)

    # -- 2.-4. the hand-off ------------------------------------------------------------------------------------

    async def _handoffs(self) -> None:
        run = self.run
        kv_port, middlebox_port = free_port(), free_port()
        # The middlebox's port is fixed before it starts: the prefill instance's connector is told it at start.
        prefill, decode = await self._start([
            InstanceSpec("prefill", free_port(), "0", {"middlebox": f"127.0.0.1:{middlebox_port}",
                                                       "record": str(self.records["prefill"])}),
            InstanceSpec("decode", free_port(), "1", {"listen": f"127.0.0.1:{kv_port}",
                                                      "record": str(self.records["decode"])})])
        for kernel in run.kernels:
            await self._start_middlebox_at(kernel, kv_port, middlebox_port)
            rows = []
            for prompt, reference in zip(self.measured.prompts, self.measured.reference, strict=True):
                rows.append(await self._one_prompt(prefill, decode, prompt, reference))
            self.measured.kernels[kernel] = {"prompts": rows, "middlebox": None}
            if run.corrupt_check and kernel == run.kernels[-1]:
                self.measured.corrupt = await self._corrupted(prefill, decode, self.measured.prompts[0])
            await asyncio.sleep(0.5)  # housekeeping: the last Acks' records reach their files
            self.measured.kernels[kernel]["middlebox"] = await self._stop_middlebox()

    async def _start_middlebox_at(self, kernel: str, kv_port: int, middlebox_port: int) -> None:
        argv = [sys.executable, "-m", "kvtransit.cli", "middlebox", "--listen", f"127.0.0.1:{middlebox_port}",
                "--decode", f"127.0.0.1:{kv_port}", "--name", f"middlebox-{kernel}",
                *self.run.scenario.to_argv(), "--codec", kernel]
        child = Child(f"middlebox ({kernel})", "middlebox", argv)
        await child.start(env={**os.environ, "PYTHONPATH": src_root()})
        self._middlebox = child
        await child.wait_ready(MIDDLEBOX_READY_S, one_line=True)

    async def _prefill(self, prefill: Instance, prompt: list[int], wire_id: int) -> client.Completion:
        return await asyncio.to_thread(client.complete, prefill.spec.port, _body(self.run, prompt, 1, wire_id))

    async def _one_prompt(self, prefill: Instance, decode: Instance, prompt: dict[str, Any],
                          reference: dict[str, Any]) -> dict[str, Any]:
        run, ids = self.run, prompt["token_ids"]
        wire_id = self._wire_id()
        first = await self._prefill(prefill, ids, wire_id)
        done = await asyncio.to_thread(client.complete, decode.spec.port,
                                       _body(run, ids, run.output_tokens, wire_id))
        row = {"prompt": prompt["name"], "wire_id": wire_id, "prefill": _completion_row(first),
               "decode": _completion_row(done)}
        if run.scored_tokens > 0 and not done.error:
            row["scored"] = await self._teacher_forced(prefill, decode, ids, reference["token_ids"])
        return row

    async def _teacher_forced(self, prefill: Instance, decode: Instance, ids: list[int],
                              continuation: list[int]) -> dict[str, Any]:
        """The prompt's KV through the link again; the decode instance computes the reference's first M tokens
        over it and answers every vocabulary token's log-probability at each of them."""
        run = self.run
        scored = continuation[:run.scored_tokens]
        wire_id = self._wire_id()
        first = await self._prefill(prefill, ids, wire_id)
        if first.error:
            return {"error": f"prefill: {first.error}"}
        # The KV of all but the prompt's last token is loaded: the decode instance computes that token over it (its
        # logits score the first continuation token) and the M - 1 after it.
        done = await asyncio.to_thread(client.prompt_logprobs, decode.spec.port,
                                       _body(run, ids + scored, 1, wire_id, kv_tokens=len(ids) - 1), -1)
        if done.error:
            return {"error": done.error}
        # Position i of the prompt carries log p(token i | tokens before it): the scored tokens' are the last M.
        positions = done.prompt_logprobs[len(ids):]
        return {"wire_id": wire_id, "tokens": scored, "logprobs": positions}

    async def _corrupted(self, prefill: Instance, decode: Instance, prompt: dict[str, Any]) -> dict[str, Any]:
        child = self._middlebox
        assert child is not None
        host, port = child.host, child.ready_info["control_port"]
        answer = await http_client.request(host, port, "PUT", "/faults/engine-corrupt",
                                           http_client.json_body({"type": "corrupt", "probability": 1.0}))
        if answer.status != 200:
            raise ConfigError(f"the middlebox refused the corrupt fault: HTTP {answer.status}")
        wire_id = self._wire_id()
        first = await self._prefill(prefill, prompt["token_ids"], wire_id)
        done = await asyncio.to_thread(client.complete, decode.spec.port,
                                       _body(self.run, prompt["token_ids"], self.run.output_tokens, wire_id))
        await http_client.request(host, port, "DELETE", "/faults/engine-corrupt")
        return {"prompt": prompt["name"], "wire_id": wire_id, "prefill": _completion_row(first),
                "decode": _completion_row(done)}


async def run_engine(run: EngineRun) -> dict[str, Any]:
    return await EngineRunner(run).go()
