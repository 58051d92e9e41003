"""The real model on the live path: what a request that carries real KV carries, and what decode
scores. No torch here: the agents import it; the model runs in a worker process (live_worker.py).

A request with `Scenario.carries_real_kv` (`--kv-sample real`: the first `--real-kv-requests` request ids) hands
off the real model's own cache over real text instead of synthetic KV: window `request_id % len(live_windows())`
of the shipped texts (texts.py), its first T tokens. T is chosen so that the real KV is as many bytes as the
request's own KV at the run's scale (the link carries the bytes the model says it should, and the request's
timing stays the model's): T = request bytes / the real model's bytes per token, at least MIN_TOKENS and at most
CONTEXT_MAX (a capped request carries fewer bytes than modelled; the prefill's stats and the report say which).
At scale 1/64 on eth-25g a 2,048-token prompt of llama3-8b is 4 MiB, 182 tokens of SmolLM2-135M (23,040 B each).

The prefill computes each window's exact prefill once, at its start, over CONTEXT_MAX tokens, and sends the
first T tokens' K (after RoPE, as the cache holds it) and V in BF16, the wire dtype: with causal attention those
are exactly the KV of a prefill over the T tokens alone. Decode's worker computes the same windows the same way
(same file, same thread count: the same floats), so its reference is bit for bit what the prefill sent, and then
teacher-forces the next CONTINUATION tokens of the text over the reference cache and over the cache that arrived
through the middlebox: top-1 agreement, KL(reference ‖ arrived) and both perplexities. With codec none and a clean
link the two caches are the same bytes, so agreement is exactly 1 and KL exactly 0: whatever differs is the link's
and the kernel's doing (the BF16 cast itself is what `kvtransit accuracy --end-to-end` measures, against float32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvtransit.realmodel.texts import DEFAULT_OFFSETS, Window

# Real tokens prefilled per window at the prefill's start. 512 covers the byte-matched T of prompts up to 5,760
# tokens at scale 1/64 (llama3-8b, 2,048 B a token there; SmolLM2 23,040 B), past the default prompts' p99 (mean
# 2,048, cv 0.5). A window's exact prefill took 1.4 s with 2 threads here (measured), about twice that with one.
CONTEXT_MAX = 512
# Tokens teacher-forced over each arrived cache, each scored: enough for an agreement figure per request (a few
# requests give 100+ scored tokens), short enough that decode's niced worker keeps up with a light run.
CONTINUATION = 32
# The fewest real tokens a request carries (a tiny prompt at a small scale would otherwise carry one or two): a
# band-keep codec's 4 sinks and a block's worth of tokens after them.
MIN_TOKENS = 16
# Torch threads of both workers: the same count on both sides, so the same floats (the reference is the prefill's
# bytes, bit for bit; 1 and 2 threads gave the same here, not promised elsewhere). One: decode's worker then leaves a
# core to the run it reads beside (a reading takes ~0.8 s instead of ~0.45 s with 2).
WORKER_THREADS = 1
# Decode's worker reads hand-offs beside the run it measures: niced to the bottom once loaded, it takes only CPU nobody
# else wants.
DECODE_WORKER_NICE = 19


def live_windows() -> list[Window]:
    """The windows real-KV requests read, in the order request ids cycle through them."""
    return [Window(text, offset, CONTEXT_MAX, CONTINUATION)
            for text, offsets in DEFAULT_OFFSETS.items() for offset in offsets]


def window_for(request_id: int) -> Window:
    windows = live_windows()
    return windows[request_id % len(windows)]


@dataclass(frozen=True)
class RealTokens:
    """How many of its window's tokens a request carries, and how many its bytes asked for."""

    tokens: int
    wanted: int

    @property
    def capped(self) -> bool:
        return self.tokens != self.wanted


def real_tokens(request_bytes: int, real_bytes_per_token: int, *, min_tokens: int = MIN_TOKENS,
                max_tokens: int = CONTEXT_MAX) -> RealTokens:
    """The real tokens whose KV is `request_bytes` (rounded), within [min_tokens, max_tokens]."""
    if real_bytes_per_token < 1:
        raise ValueError(f"real_bytes_per_token must be >= 1, got {real_bytes_per_token}")
    wanted = max(1, round(request_bytes / real_bytes_per_token))
    return RealTokens(min(max(wanted, min_tokens), max_tokens), wanted)



# What a reading of the worker adds up (live_worker.score): sums over scored tokens and over K and V values, so that
# readings pool over requests and decode instances token by token, never as a mean of means.
SUMS = ("scored", "nll_reference", "nll", "kl", "agree", "k_err2", "k_ref2", "v_err2", "v_ref2")


def figures(sums: Mapping[str, float]) -> dict[str, float | None]:
    """What pooled sums say (None where nothing was measured): top-1 agreement and mean KL per scored token, the
    continuation's perplexity over the arrived and over the sent KV and its increase, and K and V relative error."""
    scored = sums["scored"]
    ppl = math.exp(sums["nll"] / scored) if scored else None
    ppl_sent = math.exp(sums["nll_reference"] / scored) if scored else None
    return {"top1": sums["agree"] / scored if scored else None,
            "kl": sums["kl"] / scored if scored else None,
            "ppl": ppl, "ppl_sent": ppl_sent,
            "ppl_increase": ppl / ppl_sent - 1 if ppl is not None and ppl_sent else None,
            "k_relative_error": math.sqrt(sums["k_err2"] / sums["k_ref2"]) if sums["k_ref2"] else None,
            "v_relative_error": math.sqrt(sums["v_err2"] / sums["v_ref2"]) if sums["v_ref2"] else None}
