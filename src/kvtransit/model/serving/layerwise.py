"""Layer-wise KV streaming: when each part of a request's KV exists, and how much of its hand-off a user
waits for.

The reference model hands a request's KV off whole, after its prefill step (docs/reference.md §4: every request of a
step gets its first token at the step's end, "then its KV is handed off (whole, after prefill)"). Production systems
stream it as the prefill makes it: Mooncake streams new KV to decode in chunks or layers, vLLM's and Dynamo's connectors
send it per layer. A transformer computes its layers in order, so:

- **whole** (`HANDOFF_MODES[0]`, the default and the reference model's): every layer of a step's KV is released at
  the step's end, its first token;
- **layerwise**: layer l of a step that starts at S and lasts T is released when its compute ends,
  `S + (l+1)/L × T` (`release_ns`), so layer L-1 is released at the first token, as in whole mode;
- **chunked prefill** (`Scenario.prefill_chunk`): a prompt is computed a chunk of tokens a step, and each chunk's KV
  is released by its own step's schedule (whole: at its step's end; layer-wise: layer by layer within it).

What of the hand-off a user waits for (`HandoffSplit`): **exposed** = KV ready − first token (docs/reference.md §4's
hand-off, ≥ 0), and **hidden** = the part of the hand-off in flight before the first token (its time: first KV
bytes at decode → the first token; its bytes: those that reached decode by then). In whole mode nothing hides.

The model of the exposed part (`layerwise_exposed_s`): with docs/reference.md §2's `transfer = latency + bytes /
bandwidth` (plus docs/reference.md §5's module terms in transit) and L equal layers released every T/L over a step of T
on a link that is free, layer l's bytes leave when it is released or when the layer before it is through, whichever is
later. If a layer crosses within T/L, each one is through before the next exists and the last one, released at the first
token, is all that shows: exposed = latency + serialisation / L. Otherwise the link is busy from the first layer's
release, T/L into the step, and exposed = latency + serialisation − (L−1)/L × T. Both are `max(0, transfer − overlap)`
with the **prefill compute overlap** `(L−1)/L × min(T, serialisation)` (`prefill_overlap_s`). `streamed_ready_s` is the
same FIFO for any release schedule (chunks, unequal layers); the two agree on a layer-wise step
(tests/unit/test_layerwise.py).

Not in docs/reference.md: the release schedule is kvtransit's own (below); the link arithmetic is docs/reference.md §2
(transfer time), §4 (one FIFO link, hand-off = KV ready − first token) and §5 (through the module, `max(wire / bw, ops /
(budget × bw))`).

Pure: integers and floats in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvtransit.model.errors import ConfigError

HANDOFF_WHOLE = "whole"
HANDOFF_LAYERWISE = "layerwise"
HANDOFF_MODES = (HANDOFF_WHOLE, HANDOFF_LAYERWISE)


def check_mode(mode: str) -> str:
    if mode not in HANDOFF_MODES:
        raise ConfigError(f"handoff: unknown value {mode!r} (choose from: {', '.join(HANDOFF_MODES)})")
    return mode


def release_ns(mode: str, step_start_ns: int, step_ns: int, layer: int, layers: int) -> int:
    """When layer `layer` (of `layers`) of a step starting at `step_start_ns` and lasting `step_ns` exists: the
    step's end in whole mode, `start + (layer+1)/layers × step` layer-wise (integer ns; the last layer exactly at
    the step's end, the first token)."""
    check_mode(mode)
    if not 0 <= layer < layers:
        raise ConfigError(f"layer {layer} out of range 0..{layers - 1}")
    if step_ns < 0:
        raise ConfigError(f"step duration must be >= 0 ns, got {step_ns}")
    if mode == HANDOFF_WHOLE:
        return step_start_ns + step_ns
    return step_start_ns + (layer + 1) * step_ns // layers


def chunk_stops(prompt_tokens: int, cached_tokens: int, chunk_tokens: int) -> tuple[int, ...]:
    """Where a prompt's prefill chunks end (tokens of the prompt): cached + C, cached + 2C, ..., the prompt; one stop,
    the prompt, without chunking (`chunk_tokens` 0). A cached prefix is not computed: it goes with the first chunk."""
    if not 0 <= cached_tokens < prompt_tokens:
        raise ConfigError(f"cached tokens {cached_tokens} must be within 0..{prompt_tokens - 1}")
    if chunk_tokens <= 0:
        return (prompt_tokens,)
    return (*range(cached_tokens + chunk_tokens, prompt_tokens, chunk_tokens), prompt_tokens)


def kv_segments(stops: Sequence[int], min_tokens: int) -> tuple[int, ...]:
    """The stops of the slices a hand-off's frames cut the KV into along tokens: one per prefill chunk, except that a
    last chunk shorter than `min_tokens` goes with the one before it (a band-keep codec keeps its first `sinks`
    tokens exact and needs that many; kernels/bandkeep.py). A merged slice waits for its later chunk: KV is never
    released before its compute ends."""
    out = list(stops)
    if len(out) > 1 and out[-1] - out[-2] < min_tokens:
        del out[-2]
    return tuple(out)


@dataclass(frozen=True)
class StepWindow:
    """One prefill step that computes part of a request's KV: when it starts and how long it is held (wall ns)."""

    start_ns: int
    duration_ns: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


# --- what the user waits for -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HandoffSplit:
    """One hand-off split at its first token (seconds and bytes of whatever units the caller measured in).

    exposed: KV ready − first token, ≥ 0 (the docs/reference.md §4 hand-off a user waits for);
    hidden: first KV bytes at decode → min(first token, KV ready), ≥ 0 (in flight while the prefill still computed);
    hidden_bytes: of `bytes`, those that reached decode by the first token."""

    exposed_s: float
    hidden_s: float
    hidden_bytes: int
    bytes: int

    @property
    def total_s(self) -> float:
        """The hand-off's whole span: from its first bytes (or its first token, if later) to KV ready."""
        return self.exposed_s + self.hidden_s

    @classmethod
    def from_stamps(cls, *, first_token_ns: int, first_bytes_ns: int, ready_ns: int, hidden_bytes: int,
                    total_bytes: int, seconds_per_ns: float = 1e-9) -> HandoffSplit:
        """From the stamps of one clock (ns); `seconds_per_ns` converts (1e-9 / dilation: model seconds)."""
        if not 0 <= hidden_bytes <= total_bytes:
            raise ConfigError(f"hidden bytes {hidden_bytes} must be within 0..{total_bytes}")
        exposed_ns = max(0, ready_ns - first_token_ns)
        hidden_ns = max(0, min(first_token_ns, ready_ns) - first_bytes_ns)
        return cls(exposed_ns * seconds_per_ns, hidden_ns * seconds_per_ns, hidden_bytes, total_bytes)


# --- the model of the exposed part -------------------------------------------------------------------------------

def prefill_overlap_s(step_s: float, serialise_s: float, layers: int) -> float:
    """The part of a layer-wise hand-off that hides behind its prefill step on a free link: (L−1)/L × min(step,
    serialisation) (module docstring). `serialise_s`: the transfer without its latency (bytes / bandwidth, or the
    module's compute when that is slower, docs/reference.md §5)."""
    if layers < 1:
        raise ConfigError(f"layers must be >= 1, got {layers}")
    if step_s < 0 or serialise_s < 0:
        raise ConfigError(f"step and serialisation must be >= 0 s, got {step_s!r} and {serialise_s!r}")
    return (layers - 1) / layers * min(step_s, serialise_s)


def layerwise_exposed_s(transfer_s: float, overlap_s: float) -> float:
    """kvtransit's model of the exposed hand-off: max(0, transfer − prefill compute overlap), with docs/reference.md
    §2's transfer = latency + bytes / bandwidth (+ §5's module terms) and the overlap of `prefill_overlap_s`."""
    return max(0.0, transfer_s - overlap_s)


def streamed_ready_s(parts: Sequence[tuple[float, float]], latency_s: float) -> float:
    """When the last byte of a hand-off sent in `parts` (release time, serialisation time), in order, over a free
    FIFO link is at the far end: each part leaves at its release or when the one before it is through, whichever
    is later (docs/reference.md §4's one FIFO link; §2's latency + bytes / bandwidth). Whole mode is one part released
    at the first token: ready = first token + transfer."""
    if not parts:
        raise ConfigError("a hand-off needs at least one part")
    through = -math.inf
    for released_s, serialise_s in parts:
        through = max(through, released_s) + serialise_s
    return through + latency_s


def link_was_free(start: int, earlier: Iterable[tuple[int, int]], channels: int = 1) -> bool:
    """Whether a hand-off starting at `start` found one of `channels` lanes free: fewer than `channels` of the
    hand-offs that took the link before it, (start, end) each, still in flight then. A tie in start (two requests
    of one step, released together) counts the earlier one as in flight: the FIFO link serves it first."""
    return sum(1 for other_start, other_end in earlier if other_start <= start < other_end) < channels
