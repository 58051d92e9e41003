"""The serving policies of docs/reference.md §4, as pure state machines: the agents feed them, a clock does not.

- `PrefillQueue`: one prefill instance's FIFO queue and its batcher (head, then more while ≤ 8,192 tokens).
- `PrefillRouter`: the instance with the fewest queued prompt tokens.
- `DecodeBatcher`: one decode instance's continuous batch (≤ 256 running, KV reserved up front, admission
  FIFO at a step boundary, stopping at the first request that does not fit; one token per sequence a step).

A request whose client went away is `cancel`led: out of a prefill queue before its step, out of the decode batch
with its KV reservation freed (the simulator has no cancellation; this is the live testbed's).
- `DecodeRouter`: the instance with the smallest queue + running.

Everything follows the public simulator `Disaggregated_Inference_Sim` (docs/reference.md §4) so a live run and a
simulated one can be put side by side; where the simulator made a choice the text does not spell out, the
docstring says which. Times never appear here: the agents hold the step durations on their own clocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from kvtransit.model.errors import ConfigError

# Token budget of one prefill step (docs/reference.md §4; the simulator's `max_prefill_tokens`).
PREFILL_BATCH_TOKEN_LIMIT = 8192
# Most sequences one decode instance runs at once (docs/reference.md §4; the simulator's `max_decode_batch`).
MAX_DECODE_BATCH = 256


@dataclass(frozen=True)
class ServingRequest:
    """What the serving policies need to know of a request: its id and its lengths in tokens."""

    request_id: Hashable
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ConfigError(f"request {self.request_id!r}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ConfigError(f"request {self.request_id!r}: output_tokens must be >= 1, got {self.output_tokens}")

    @property
    def kv_reservation_tokens(self) -> int:
        """KV a decode instance reserves up front for the whole sequence: prompt + output (docs/reference.md §4)."""
        return self.prompt_tokens + self.output_tokens


# ───────────────────────────────────────────────────────────────────────────── prefill ──


Entry = TypeVar("Entry")


class PromptFifo(Generic[Entry]):
    """A prefill instance's strict FIFO of queued prompts and the prompt tokens still to compute in it (the
    router's load figure): what the whole-prompt and the chunked queue share; each says what an entry is and
    how a batch is taken."""

    def __init__(self, token_limit: int) -> None:
        if token_limit < 1:
            raise ConfigError(f"prefill batch token limit must be >= 1, got {token_limit}")
        self.token_limit = token_limit
        self._queue: deque[Entry] = deque()
        self._queued_tokens = 0

    def _append(self, entry: Entry, tokens: int) -> None:
        self._queue.append(entry)
        self._queued_tokens += tokens

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def queued_tokens(self) -> int:
        """Prompt tokens still to compute (the router's load figure)."""
        return self._queued_tokens

    def _pending(self, entry: Entry) -> tuple[ServingRequest, int]:
        """A queued entry's request and the prompt tokens it still has to compute (each queue says, by its entry)."""
        raise NotImplementedError

    def cancel(self, request_id: Hashable) -> bool:
        """Drop the queued request `request_id` (its client went away), with the prompt tokens it still had to
        compute. False when it is not queued: never pushed, cancelled already, or its (last) chunk was taken into
        a step, which runs whole. The others keep their order."""
        for entry in self._queue:
            request, pending_tokens = self._pending(entry)
            if request.request_id == request_id:
                self._queue.remove(entry)
                self._queued_tokens -= pending_tokens
                return True
        return False


class PrefillQueue(PromptFifo[ServingRequest]):
    """One prefill instance's FIFO queue and batcher.

    `take_batch` takes the head whatever its size (a 32k-token prompt still runs, alone), then more from
    the head while the batch stays within the token budget, and stops at the first request that would
    overflow it: strict FIFO, no skipping ahead (the simulator's `PrefillInstance.run`). A request
    `runs_alone` says so of (a ring request: its prefill is the ring's, flows/ring/ring_class.py) is a batch of
    its own, and no batch takes it as a follower.
    """

    def __init__(self, token_limit: int = PREFILL_BATCH_TOKEN_LIMIT,
                 runs_alone: Callable[[ServingRequest], bool] | None = None) -> None:
        super().__init__(token_limit)
        self._alone = runs_alone or (lambda request: False)

    def push(self, request: ServingRequest) -> None:
        self._append(request, request.prompt_tokens)

    def _pending(self, entry: ServingRequest) -> tuple[ServingRequest, int]:
        return entry, entry.prompt_tokens

    def take_batch(self) -> list[ServingRequest]:
        """The next batch (empty when the queue is)."""
        batch: list[ServingRequest] = []
        tokens = 0
        while self._queue and (not batch or (tokens + self._queue[0].prompt_tokens <= self.token_limit
                                             and not self._alone(self._queue[0]))):
            request = self._queue.popleft()
            batch.append(request)
            tokens += request.prompt_tokens
            if self._alone(request):
                break
        self._queued_tokens -= tokens
        return batch


def least_loaded(loads: Sequence[float]) -> int:
    """Index of the smallest load; ties go to the lowest index (Python's `min`, as the simulator uses)."""
    if not loads:
        raise ConfigError("no instances to route to")
    return min(range(len(loads)), key=loads.__getitem__)


class PrefillRouter:
    """Sends each request to the prefill instance with the fewest queued prompt tokens.

    The router lives in the load generator, which cannot see inside an instance: it counts a request's
    prompt tokens against its instance from dispatch until that request's first token comes back, so the
    batch being computed counts too (the simulator counts only the waiting queue; the two agree whenever an
    instance is idle or all instances are equally busy, which is when routing choices are made at light load).
    """

    def __init__(self, instances: int) -> None:
        if instances < 1:
            raise ConfigError(f"prefill instances must be >= 1, got {instances}")
        self._tokens = [0] * instances
        self._owner: dict[Hashable, tuple[int, int]] = {}

    @property
    def queued_tokens(self) -> tuple[int, ...]:
        return tuple(self._tokens)

    def assign(self, request: ServingRequest) -> int:
        if request.request_id in self._owner:
            raise ConfigError(f"request {request.request_id!r} routed twice")
        instance = least_loaded(self._tokens)
        self._tokens[instance] += request.prompt_tokens
        self._owner[request.request_id] = (instance, request.prompt_tokens)
        return instance

    def complete(self, request_id: Hashable) -> None:
        """The request's first token came back (or it failed): it no longer loads its instance."""
        entry = self._owner.pop(request_id, None)
        if entry is not None:
            instance, tokens = entry
            self._tokens[instance] -= tokens


# ───────────────────────────────────────────────────────────────────────────── decode ──


@dataclass
class RunningSequence:
    """A sequence in the continuous batch. It got its first token at prefill, so it starts at 1."""

    request: ServingRequest
    tokens_out: int = 1

    @property
    def context_tokens(self) -> int:
        """Prompt + tokens so far: this sequence's share of the step's attention context."""
        return self.request.prompt_tokens + self.tokens_out

    @property
    def done(self) -> bool:
        return self.tokens_out >= self.request.output_tokens


@dataclass(frozen=True)
class StepResult:
    """What one decode step produced: (request id, token index) per running sequence, and who finished.

    Token indices count from 0 = the first token (made at prefill), so a step's tokens have index ≥ 1.
    """

    tokens: tuple[tuple[Hashable, int], ...]
    finished: tuple[Hashable, ...]


class DecodeBatcher:
    """One decode instance's continuous batch (docs/reference.md §4; the simulator's `admit_decode` + `decode_once`).

    Call `admit()` at each step boundary, then, if anything runs, hold the step for the time
    `model.decode_plan.plan_decode_step` gives (the roofline `decode_step_s(batch_size, context_tokens)`, plus,
    with the codec on the prefill GPU, the inverse of the KV just admitted) and call `step()`.
    """

    def __init__(self, kv_capacity_tokens: int, max_running: int = MAX_DECODE_BATCH) -> None:
        if kv_capacity_tokens < 1:
            raise ConfigError(f"decode KV capacity must be >= 1 token, got {kv_capacity_tokens}")
        if max_running < 1:
            raise ConfigError(f"decode max running must be >= 1, got {max_running}")
        self.kv_capacity_tokens = kv_capacity_tokens
        self.max_running = max_running
        self._waiting: deque[ServingRequest] = deque()
        self._running: list[RunningSequence] = []
        self._reserved = 0

    def fits_ever(self, request: ServingRequest) -> bool:
        """Whether the request could ever be admitted (the simulator rejects those that cannot, on arrival)."""
        return request.kv_reservation_tokens <= self.kv_capacity_tokens

    def enqueue(self, request: ServingRequest) -> None:
        if not self.fits_ever(request):
            raise ConfigError(
                f"request {request.request_id!r} needs {request.kv_reservation_tokens} KV tokens, more than the "
                f"decode instance holds ({self.kv_capacity_tokens})"
            )
        self._waiting.append(request)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def load(self) -> int:
        """Queue + running: the decode router's load figure."""
        return len(self._waiting) + len(self._running)

    @property
    def reserved_tokens(self) -> int:
        return self._reserved

    @property
    def running_ids(self) -> tuple[Hashable, ...]:
        return tuple(seq.request.request_id for seq in self._running)

    @property
    def context_tokens(self) -> int:
        """Σ (prompt + tokens so far) over the running sequences: the decode step's `ctx`."""
        return sum(seq.context_tokens for seq in self._running)

    def admit(self) -> list[ServingRequest]:
        """Admit from the head of the queue while there is a free slot and the KV fits; stop at the first
        that does not fit (FIFO, no skipping). A request with one output token has nothing left to decode:
        it is admitted and finishes at once (returned, never running)."""
        admitted: list[ServingRequest] = []
        while (
            self._waiting
            and len(self._running) < self.max_running
            and self._reserved + self._waiting[0].kv_reservation_tokens <= self.kv_capacity_tokens
        ):
            request = self._waiting.popleft()
            admitted.append(request)
            seq = RunningSequence(request)
            if not seq.done:
                self._reserved += request.kv_reservation_tokens
                self._running.append(seq)
        return admitted

    def cancel(self, request_id: Hashable) -> bool:
        """Take `request_id` out (its client went away): waiting, it leaves the queue; running, it leaves the batch
        and frees its KV reservation, so no later step makes a token for it and the next admission may use the
        room. False when it is neither (its KV has not arrived, it finished, or it was cancelled already)."""
        for waiting in self._waiting:
            if waiting.request_id == request_id:
                self._waiting.remove(waiting)
                return True
        for index, seq in enumerate(self._running):
            if seq.request.request_id == request_id:
                del self._running[index]
                self._reserved -= seq.request.kv_reservation_tokens
                return True
        return False

    def step(self) -> StepResult:
        """One decode step: a token for every running sequence; the finished leave and free their KV."""
        tokens: list[tuple[Hashable, int]] = []
        finished: list[Hashable] = []
        still: list[RunningSequence] = []
        for seq in self._running:
            tokens.append((seq.request.request_id, seq.tokens_out))
            seq.tokens_out += 1
            if seq.done:
                self._reserved -= seq.request.kv_reservation_tokens
                finished.append(seq.request.request_id)
            else:
                still.append(seq)
        self._running = still
        return StepResult(tuple(tokens), tuple(finished))


class DecodeRouter:
    """Sends each arriving KV to the decode instance with the smallest queue + running (ties: lowest index).

    The middlebox routes; it learns the loads from what it has sent and what has finished.
    """

    def __init__(self, instances: int) -> None:
        if instances < 1:
            raise ConfigError(f"decode instances must be >= 1, got {instances}")
        self._load = [0] * instances
        self._owner: dict[Hashable, int] = {}

    @property
    def loads(self) -> tuple[int, ...]:
        return tuple(self._load)

    def assign(self, request_id: Hashable) -> int:
        if request_id in self._owner:
            raise ConfigError(f"request {request_id!r} routed twice")
        instance = least_loaded(self._load)
        self._load[instance] += 1
        self._owner[request_id] = instance
        return instance

    def complete(self, request_id: Hashable) -> None:
        instance = self._owner.pop(request_id, None)
        if instance is not None:
            self._load[instance] -= 1


def total_prompt_tokens(requests: Iterable[ServingRequest]) -> int:
    return sum(r.prompt_tokens for r in requests)
