"""The real model's side of the live path, run as a process of its own (agents/common/model_worker.py starts
`python -m kvtransit.realmodel.live_worker --nice N --threads N`).

It loads the model, then answers requests read from stdin until stdin closes or it is told to stop (None). A
request is [name, args]; the answer, on the file descriptor stdout had at start, is ["ok", value] or ["error", one
line]: both packed by worker_wire.py (JSON, bytes and arrays; no pickle), each after its length. File descriptor 1
itself is pointed at stderr first, so whatever a library prints cannot corrupt the answers.
The model runs here, not in the agent, so its seconds of CPU never hold the agent's GIL (the event loop and its
step timers), and decode's worker, niced, takes only CPU the run leaves (live.py says what is computed).

- `describe`: the model file and its KV shape (layers, kv_heads, head_dim), what the report names.
A window crosses as its fields (texts.Window as a dict).

- `exact_rows(window)`: per layer, the window's exact K (after RoPE) and V in BF16 rows [2·kv_heads, CONTEXT_MAX,
  head_dim] (K heads, then V heads: kv_frames.as_rows), what the prefill sends the first T tokens of.
- `score(window, chunks, model)`: the chunks that arrived for one request, decoded (kernels/chunk_rows.py), against
  the same window's exact rows: the K and V reconstruction error, whether raw KV arrived bit for bit, and with
  `model`, the continuation teacher-forced over both caches (end_to_end.score: NLL, KL, top-1 agreement).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Any

import numpy as np
import torch

from kvtransit.kernels.chunk_rows import IDENTITY_CODEC_ID, Chunk, decoded_layers
from kvtransit.realmodel.end_to_end import score as score_logits
from kvtransit.realmodel.end_to_end import wire_rows
from kvtransit.realmodel.errors import RealModelError
from kvtransit.realmodel.session import LayerKV, Session
from kvtransit.realmodel.texts import Window, read_text, window_tokens
from kvtransit.realmodel.worker_wire import LENGTH_BYTES, frame, unpack

WIRE_DTYPE = "bfloat16"  # what the prefill sends (docs/reference.md §1)
REQUESTS = ("describe", "exact_rows", "prepare", "score")  # what a worker answers


class _Worker:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._text_ids: dict[str, list[int]] = {}
        self._exact: dict[str, list[np.ndarray]] = {}

    def describe(self) -> dict[str, Any]:
        s = self.session
        return {**s.describe(), "bytes_per_value": 2}

    def window_ids(self, window: Window) -> list[int]:
        if window.text not in self._text_ids:
            self._text_ids[window.text] = self.session.tokenize(read_text(window.text))
        return window_tokens(window, self._text_ids[window.text])

    def exact_rows(self, fields: dict[str, Any]) -> list[np.ndarray]:
        return self._exact_rows(Window(**fields))

    def _exact_rows(self, window: Window) -> list[np.ndarray]:
        if window.name not in self._exact:
            pre = self.session.prefill(self.window_ids(window)[:window.context])
            self._exact[window.name] = wire_rows([k for k, _ in pre.cache], pre.cache, WIRE_DTYPE)
        return self._exact[window.name]

    def prepare(self, windows: list[dict[str, Any]], model: bool) -> int:
        """Before the run: every window's exact rows, and one continuation scored over the first (its own rows as
        if they had arrived), so the run's readings allocate no fresh memory. Measured: without it, decode's first
        readings during a run made the prefill's and decode's step timers wake 40-130 ms late at once (a stall of
        the whole VM while this process touched memory for the first time). Returns the windows made."""
        for fields in windows:
            self._exact_rows(Window(**fields))
        if windows and model:
            window = Window(**windows[0])
            rows = self._exact_rows(window)
            self._continuation(window, window.context, rows, rows)
        return len(windows)

    def score(self, fields: dict[str, Any], chunks: list[Chunk], model: bool) -> dict[str, Any]:
        window = Window(**fields)
        s = self.session
        exact = self._exact_rows(window)
        arrived = dict(decoded_layers(chunks, 2 * s.kv_heads))
        if sorted(arrived) != list(range(s.layers)):
            raise RealModelError(f"window {window.name}: KV arrived for layers {sorted(arrived)}, the model has "
                                 f"{s.layers}")
        tokens = arrived[0].shape[1]
        if not 1 <= tokens <= window.context or any(rows.shape != arrived[0].shape for rows in arrived.values()):
            raise RealModelError(f"window {window.name}: arrived KV of shape {arrived[0].shape} does not fit the "
                                 f"window's {window.context} tokens")
        reference = [rows[:, :tokens] for rows in exact]
        raw = all(chunk[1] == IDENTITY_CODEC_ID for chunk in chunks)
        out: dict[str, Any] = {"window": window.name, "tokens": tokens, "raw": raw,
                               "raw_mismatch": raw and any(np.ascontiguousarray(ref).tobytes() != arrived[i].tobytes()
                                                           for i, ref in enumerate(reference))}
        kv = s.kv_heads
        for part, rows in (("k", slice(0, kv)), ("v", slice(kv, 2 * kv))):
            ref32 = [r[rows].astype(np.float64) for r in reference]
            got32 = [arrived[i][rows].astype(np.float64) for i in range(s.layers)]
            out[f"{part}_err2"] = float(sum(np.sum((g - r) ** 2) for g, r in zip(got32, ref32, strict=True)))
            out[f"{part}_ref2"] = float(sum(np.sum(r ** 2) for r in ref32))
        if model:
            out |= self._continuation(window, tokens, reference, [arrived[i] for i in range(s.layers)])
        return out

    def _continuation(self, window: Window, tokens: int, reference: list[np.ndarray],
                      arrived: list[np.ndarray]) -> dict[str, Any]:
        ids = self.window_ids(window)
        inputs, targets = ids[tokens:tokens + window.continuation], torch.tensor(
            ids[tokens + 1:tokens + window.continuation + 1])
        positions = list(range(tokens, tokens + window.continuation))
        ref_logits = self.session.forward_over(_cache(reference, self.session.kv_heads), inputs, positions)
        ref_logp = ref_logits.double().log_softmax(-1)
        ref_top = ref_logits.argmax(-1)
        ref = score_logits(ref_logits, ref_logp, ref_top, targets)
        got = score_logits(self.session.forward_over(_cache(arrived, self.session.kv_heads), inputs, positions),
                           ref_logp, ref_top, targets)
        return {"scored": got.tokens, "nll_reference": ref.nll, "nll": got.nll, "kl": got.kl, "agree": got.agree}


def _cache(layers: list[np.ndarray], kv_heads: int) -> list[LayerKV]:
    out = []
    for rows in layers:
        t = torch.from_numpy(np.array(rows, dtype=np.float32))  # a copy: what arrived is read-only
        out.append((t[:kv_heads].contiguous(), t[kv_heads:].contiguous()))
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    message = text[0] if text else "no message"
    return message if isinstance(exc, RealModelError) else f"{type(exc).__name__}: {message}"


def write_message(stream: IO[bytes], message: Any) -> None:
    stream.write(frame(message))
    stream.flush()


def read_message(stream: IO[bytes]) -> Any:
    """The next message, or raise EOFError when the stream ends (the agent is gone)."""
    head = stream.read(LENGTH_BYTES)
    if len(head) < LENGTH_BYTES:
        raise EOFError("the agent closed the pipe")
    size = int.from_bytes(head, "big")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the agent closed the pipe mid-message")
    return unpack(data)


def renice_threads(increment: int) -> None:
    """Add `increment` to the niceness of every thread of this process. Linux keeps a niceness per thread and
    os.nice sets only the caller's: torch's OpenMP threads, started while the model loaded, kept niceness 0 (seen in
    /proc). Niced all, the run's timers did not improve by themselves (the stalls were the first readings' fresh
    memory: `_Worker.prepare`), but a worker meant to take only what the run leaves must not keep two threads at 0.
    Threads started later inherit the main thread's."""
    for tid in (int(name) for name in os.listdir("/proc/self/task")):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue


def serve(requests: IO[bytes], answers: IO[bytes], threads: int, nice_after_load: int = 0) -> None:
    """Load the model, add `nice_after_load` to our niceness, then answer (name, args) requests until the stream ends
    or a None arrives."""
    worker: _Worker | None = None
    failed = ""
    try:
        worker = _Worker(Session(threads=threads))
    except Exception as exc:  # said to every request, one line, instead of a dead pipe
        failed = f"the real model did not load: {_one_line(exc)}"
    if nice_after_load:
        renice_threads(nice_after_load)
    while True:
        try:
            request = read_message(requests)
        except EOFError:  # the agent is gone: so is its worker
            return
        if request is None:
            return
        name, args = request
        if name not in REQUESTS:
            write_message(answers, ("error", f"unknown request {name!r} (a worker answers {', '.join(REQUESTS)})"))
        elif worker is None:
            write_message(answers, ("error", failed))
        else:
            try:
                write_message(answers, ("ok", getattr(worker, name)(*args)))
            except Exception as exc:  # the agent reports it against the request, one line
                write_message(answers, ("error", _one_line(exc)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvtransit.realmodel.live_worker")
    parser.add_argument("--nice", type=int, default=0, help="niceness to add before loading the model")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--nice-after-load", type=int, default=0, help="niceness to add once the model has loaded")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints (a library's) go to stderr, never into the answers
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, answers, args.threads, args.nice_after_load)


if __name__ == "__main__":
    main()
