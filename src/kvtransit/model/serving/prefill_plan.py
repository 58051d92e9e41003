"""One prefill step, planned before it is held (docs/reference.md §3-§4; the I/O is agents/prefill/agent.py).

The batch is what `PrefillQueue.take_batch` gave (model/serving/policies.py). For it the plan says how long the step
holds and what it costs:

- **time**: the roofline prefill of the batch, each prompt starting from the tokens its prefix lookup found
  cached (`prefill_step_cached_s`: the cached KV is re-read, not recomputed; with nothing cached it is exactly
  `prefill_step_s`), plus, when the codec runs on the prefill GPU (`compress_at="gpu"`), the codec's GPU time
  of every request (`Scenario.gpu_codec_s`); held on the wall clock × dilation;
- **energy**: the step's GPU energy (`step_energy_j`) plus, with the codec on the GPU, the codec's work
  (`Scenario.gpu_codec_work`);
- **hand-offs**: which requests go on to decode (output > 1 token) and which are done at their first token,
  as in the simulator.

A flow may plan a step itself (model/sections.py: `Section.prefill_step`; ring attention plans a ring request's step,
a batch of its own that the queue keeps alone), and an instance of more than one TP group GPU has its step held as
the group holds it (`Section.group_step`: the shard's roofline and the step's collectives). Either way the plan
carries what the flow's live part needs (`extra`), and the agent hands such a step to that flow's component.

With chunked prefill (`Scenario.prefill_chunk`) the batch is what `ChunkedPrefillQueue.take_batch`
gave: the next chunk of each request it holds, in FIFO order (Sarathi-Serve's chunked prefill, as vLLM schedules
it: one chunk of a prompt a step, the prompt's earlier chunks read back as context). An entry is then one chunk:
`prompt_tokens` is the context after it, `cached_tokens` the context before it (its prefix found cached, and its
earlier chunks), and only a request's last chunk gives its first token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvtransit.model.cost.roofline import StepWork, prefill_step_cached_s, prefill_work_cached, step_energy_j
from kvtransit.model.errors import ConfigError
from kvtransit.model.scenario import PREFILL_CHUNK_RANGE, Scenario
from kvtransit.model.sections import GroupStep, Section, StepExtra
from kvtransit.model.serving.policies import PREFILL_BATCH_TOKEN_LIMIT, PrefillQueue, PromptFifo, ServingRequest


@dataclass(frozen=True)
class BatchEntry:
    """One request of the batch, as the step sees it."""

    request_id: Hashable
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0  # of the prompt, found cached by its prefix lookup (0 without prefix reuse)
    # Chunked prefill: this step computes one chunk of the prompt; `prompt_tokens` is the context after it and
    # `cached_tokens` the context before it. Whole prompts are their own first and last chunk.
    first_chunk: bool = True
    last_chunk: bool = True

    @property
    def hands_off(self) -> bool:
        """Its KV goes on to decode; with a single output token the request is done at its first token."""
        return self.output_tokens > 1

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV this step adds to the request's hand-off: all the context on its first chunk (a cached
        prefix goes with it), then each chunk's own."""
        return self.prompt_tokens if self.first_chunk else self.prompt_tokens - self.cached_tokens


def batch_entry(item: ServingRequest | PrefillChunk, request_id: Hashable, cached_tokens: int,
                output_tokens: int) -> BatchEntry:
    """The step's view of a queued request (or of one chunk of it): what was queued is the prompt less its cached
    prefix (the cached tokens are re-read, not computed), so its context before and after the step are shifted by
    `cached_tokens`. The prefill agent's and the twin's."""
    if isinstance(item, PrefillChunk):
        start, stop, first, last = item.start, item.stop, item.first, item.last
    else:
        start, stop, first, last = 0, item.prompt_tokens, True, True
    return BatchEntry(request_id, cached_tokens + stop, output_tokens, cached_tokens + start, first, last)


@dataclass(frozen=True)
class PrefillStepPlan:
    entries: tuple[BatchEntry, ...]
    model_s: float  # modelled step time, the GPU codec's and the TP group's all-reduces included
    wall_s: float  # as held: model_s × dilation
    energy_j: float  # GPU energy of the step, the GPU codec's included
    collective_s: float = 0.0  # of model_s, the TP group's all-reduces (0 without a group)
    extra: StepExtra | None = None  # what a flow's live part runs in this step (its component holds the step)

    @property
    def compute_s(self) -> float:
        """The part held before the all-reduces."""
        return self.model_s - self.collective_s

    @property
    def handoffs(self) -> tuple[BatchEntry, ...]:
        return tuple(e for e in self.entries if e.hands_off)

    @property
    def done_at_prefill(self) -> tuple[BatchEntry, ...]:
        return tuple(e for e in self.entries if not e.hands_off)


def prefill_queue(scenario: Scenario) -> PrefillQueue | ChunkedPrefillQueue:
    """One prefill instance's queue for `scenario`: chunked with `prefill_chunk`, else FIFO batches in which a request
    a flow says runs alone (model/sections.py: `Section.runs_alone`; a ring request) is a batch of its own."""
    if scenario.prefill_chunk:
        return ChunkedPrefillQueue(scenario.prefill_chunk)
    sections = [s for s in scenario.enabled_sections if type(s).runs_alone is not Section.runs_alone]
    if not sections:
        return PrefillQueue()
    return PrefillQueue(runs_alone=lambda r: isinstance(r.request_id, int)
                        and any(s.runs_alone(scenario, r.request_id) for s in sections))


def codec_on_gpu(scenario: Scenario) -> bool:
    """Whether the prefill GPU runs the codec (the all-GPU baseline): `compress_at="gpu"` with a real codec."""
    return scenario.compress_at == "gpu" and scenario.codec != "none"


def plan_prefill_step(scenario: Scenario, entries: Sequence[BatchEntry]) -> PrefillStepPlan:
    """The plan of a step over `entries` (at least one); the module docstring says what goes in."""
    for section in scenario.enabled_sections:
        planned = section.prefill_step(scenario, entries)
        if planned is not None:
            return planned
    model, device = scenario.model_spec, scenario.device_spec
    prompts = [(e.prompt_tokens, e.cached_tokens) for e in entries]
    codec_s = sum(scenario.gpu_codec_s(e.kv_tokens) for e in entries)
    work = prefill_work_cached(model, prompts)
    energy_j = step_energy_j(device, work)
    if codec_on_gpu(scenario):
        energy_j += sum(step_energy_j(device, scenario.gpu_codec_work(e.kv_tokens)) for e in entries)
    group = group_step(scenario, "prefill", work, sum(p - c for p, c in prompts))
    if group is None:
        model_s = prefill_step_cached_s(model, device, scenario.gpus, prompts) + codec_s
        return PrefillStepPlan(tuple(entries), model_s, scenario.wall_s(model_s), energy_j)
    model_s = group.total_s + codec_s
    return PrefillStepPlan(tuple(entries), model_s, scenario.wall_s(model_s), energy_j, group.collective_s,
                           group.extra)


def group_step(scenario: Scenario, role: str, work: StepWork, tokens: int) -> GroupStep | None:
    """`role`'s step as its instance's TP group holds it (model/sections.py: `Section.group_step`), or None for an
    instance of one group of `gpus` GPUs. A group size with no flow to run it is refused, never held as one GPU."""
    size = scenario.prefill_tp if role == "prefill" else scenario.decode_tp
    if size == 1:
        return None
    for section in scenario.enabled_sections:
        step = section.group_step(scenario, role, work, tokens)
        if step is not None:
            return step
    raise ConfigError(f"{role}_tp: {size} needs a flow that runs TP groups (kvtransit/flows: tp); none answered")


# --- chunked prefill ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PrefillChunk:
    """One chunk of a request's prompt, tokens [start, stop) of the `request.prompt_tokens` it has to compute."""

    request: ServingRequest
    start: int
    stop: int

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.stop == self.request.prompt_tokens

    @property
    def tokens(self) -> int:
        return self.stop - self.start


class ChunkedPrefillQueue(PromptFifo[tuple[ServingRequest, int]]):
    """One prefill instance's FIFO queue with chunked prefill: a step takes the next chunk (at most `chunk_tokens`)
    of the head request, then the next chunk of each request behind it while the batch stays within the token
    budget, stopping at the first that would overflow it (docs/reference.md §4's strict FIFO, one chunk a request a
    step: a chunk needs the KV of the chunks before it). A request keeps its place until its last chunk has run. The
    same face as `serving.PrefillQueue`, whose batches it gives when every prompt fits in one chunk."""

    def __init__(self, chunk_tokens: int, token_limit: int = PREFILL_BATCH_TOKEN_LIMIT) -> None:
        lo, hi = PREFILL_CHUNK_RANGE
        if not lo <= chunk_tokens <= min(hi, token_limit):
            raise ConfigError(f"prefill chunk: {chunk_tokens} tokens is outside {lo}..{min(hi, token_limit)}")
        super().__init__(token_limit)  # entries: (request, tokens computed so far)
        self.chunk_tokens = chunk_tokens

    def push(self, request: ServingRequest) -> None:
        self._append((request, 0), request.prompt_tokens)

    def _pending(self, entry: tuple[ServingRequest, int]) -> tuple[ServingRequest, int]:
        request, computed = entry  # its queued tokens went down by each chunk taken
        return request, request.prompt_tokens - computed

    def take_batch(self) -> list[PrefillChunk]:
        """The next batch of chunks (empty when the queue is)."""
        batch: list[PrefillChunk] = []
        tokens = 0
        kept: deque[tuple[ServingRequest, int]] = deque()
        while self._queue:
            request, done = self._queue[0]
            size = min(self.chunk_tokens, request.prompt_tokens - done)
            if batch and tokens + size > self.token_limit:
                break
            self._queue.popleft()
            batch.append(PrefillChunk(request, done, done + size))
            tokens += size
            if done + size < request.prompt_tokens:
                kept.append((request, done + size))
        self._queue.extendleft(reversed(kept))  # unfinished requests keep their places, ahead of the rest
        self._queued_tokens -= tokens
        return batch
