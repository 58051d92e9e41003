"""Kernel stage: run the link's codec on each raw KV chunk, off the event loop.

numpy/scipy release the GIL, so a worker thread encodes while the loop keeps every socket flowing. One
worker: chunks of a hand-off stay in order, and the two cores of a small host are not oversubscribed.
A chunk that arrives already encoded (the prefill compressed at the GPU) passes through untouched.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from kvtransit.agents.common.kv_frames import IDENTITY_CODEC_ID, byte_view, codec_id, transit_codec
from kvtransit.agents.middlebox.chunk_in_flight import ChunkInFlight
from kvtransit.agents.middlebox.stages.base import Stage
from kvtransit.kernels.registry import Codec
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Action, BudgetResult, KernelDeclaration, Module, Policy, budget_check
from kvtransit.wire import crc32c
from kvtransit.wire.events import DType

if TYPE_CHECKING:
    from kvtransit.agents.middlebox.stages.chain import ChainSettings

# Wire element types the codecs accept (the prefill sends BF16, docs/reference.md §1; tests also send f16/f32).
NUMPY_DTYPES = {DType.BF16: np.dtype(ml_dtypes.bfloat16), DType.F16: np.dtype(np.float16),
                DType.F32: np.dtype(np.float32)}

# Where a chunk's codec ran (a chunk's `runs_on`, the kernel's too). Not the declaration's `placement`
# (pluggable | switch: which streams the module sees), nor the emulator's (netns | loopback: where links run).
RUNS_ON_MODULE = "module"  # in transit, charged to the module
RUNS_ON_HOST = "host"  # on the middlebox's host (policy host): the module is not charged
RUNS_ON_NONE = "none"  # no kernel: raw bytes pass through


@dataclass(frozen=True)
class KernelConfig:
    """Which codec the module runs, with its parameters (what `PUT /kernel` edits)."""

    codec: str = "none"
    keep: float = 0.5
    block: int = 64
    sinks: int = 4
    variant: str = "dct"
    precision_bits: int | None = None
    # Does the transform count against the module's budget? False models passive optics (the simulator's
    # stage, docs/reference.md §5); True charges 1.25·log2 N ops per byte (the kernel table's "transform charged").
    transform_charged: bool = False
    placement: str = "pluggable"  # the declaration's placement (docs/reference.md §5): "pluggable" or "switch"

    def as_dict(self) -> dict:
        return {"codec": self.codec, "keep": self.keep, "block": self.block, "sinks": self.sinks,
                "variant": self.variant, "precision_bits": self.precision_bits,
                "transform_charged": self.transform_charged, "placement": self.placement}


@dataclass(frozen=True)
class ActiveKernel:
    """A validated kernel: the codec object, the module's verdict on it, and where it runs."""

    config: KernelConfig
    codec: Codec | None  # None: no kernel (raw bytes pass through)
    declaration: KernelDeclaration | None  # what the module is charged for it (transform charged or not)
    budget: BudgetResult | None
    runs_on: str  # RUNS_ON_MODULE (in transit) or RUNS_ON_HOST (policy host), or RUNS_ON_NONE (no kernel)

    @property
    def name(self) -> str:
        return self.config.codec


def activate(config: KernelConfig, module: Module, policy: Policy) -> ActiveKernel:
    """Build and judge a kernel. A kernel the module may not run is refused here (ConfigError), by policy."""
    if config.codec == "none":
        return ActiveKernel(config, None, None, None, RUNS_ON_NONE)
    # The one codec object for these settings: a warmed pool stores what this codec makes (flows/tier/pool_blocks.py).
    codec = transit_codec(config.codec, keep=config.keep, block=config.block, sinks=config.sinks,
                          variant=config.variant, precision_bits=config.precision_bits)
    # The run's (or the live API's) unknowns override the preset's: the same declaration Scenario.codec_declaration
    # builds, so the middlebox and the model (model/judge/fidelity.py) judge the kernel alike.
    declaration = replace(codec.declaration, transform_charged=config.transform_charged,
                          precision_bits=config.precision_bits, placement=config.placement)
    verdict = budget_check(declaration, module, policy)
    if verdict.action is Action.REJECTED:
        raise ConfigError(f"kernel {config.codec!r} refused by the module: {verdict.describe()} "
                          f"(policy {policy.value}; use policy 'host' to run it on the host instead)")
    runs_on = RUNS_ON_HOST if verdict.action is Action.ON_HOST else RUNS_ON_MODULE
    return ActiveKernel(config, codec, declaration, verdict, runs_on)


class KernelStage(Stage):
    """The codec on each raw chunk. `kernel` is the live one: a hand-off takes it at its KvBegin."""

    name = "kernel"

    def __init__(self, kernel: ActiveKernel, *, module: Module, policy: Policy, threads: int = 1):
        """`module`, `policy`: what a new kernel is judged by (`reconfigure`)."""
        self.kernel = kernel
        self.module = module
        self.policy = policy
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kernel")

    @classmethod
    def from_settings(cls, settings: ChainSettings) -> KernelStage:
        kernel = activate(settings.kernel, settings.module, settings.policy)
        return cls(kernel, module=settings.module, policy=settings.policy, threads=settings.kernel_threads)

    def describe(self) -> dict:
        k, decl = self.kernel, self.kernel.declaration
        # Transit-bound (docs/reference.md §5): ops / (budget × bw) > wire / bw, i.e. charged × ratio > budget.
        bound = (k.runs_on == RUNS_ON_MODULE and decl is not None
                 and decl.charged_ops_per_byte * decl.ratio > self.module.ops_per_byte)
        return {"stage": self.name, **k.config.as_dict(), "runs": k.runs_on,
                "charged_ops_per_byte": None if decl is None else decl.charged_ops_per_byte,
                "budget_ops_per_byte": self.module.ops_per_byte, "transit_bound": bound,
                "budget": None if k.budget is None else k.budget.describe()}

    def reconfigure(self, update: dict) -> None:
        """`PUT /kernel`: any subset of KernelConfig's fields; the rest keep their value. Refused (ConfigError,
        KernelInputError) before anything changes; applies to hand-offs that start from now on."""
        self.kernel = activate(replace(self.kernel.config, **update), self.module, self.policy)

    async def process(self, item: ChunkInFlight, kernel: ActiveKernel) -> ChunkInFlight:
        """Encode `item` with `kernel` (the one its hand-off started with; a live change applies to the next)."""
        chunk = item.chunk
        if kernel.codec is None or chunk.codec_id != IDENTITY_CODEC_ID:
            return item
        dtype = NUMPY_DTYPES.get(chunk.dtype)
        if dtype is None:
            raise ConfigError(f"kernel {kernel.name!r} cannot take {chunk.dtype.name} chunks "
                              f"(request {chunk.request_id} chunk {chunk.chunk})")
        raw = np.frombuffer(chunk.payload, dtype=dtype).reshape(chunk.shape)
        encoded, payload, crc, seconds = await asyncio.get_running_loop().run_in_executor(
            self._executor, _timed_encode, kernel.codec, raw)
        item.chunk = replace(chunk, codec_id=codec_id(kernel.name), codec_header=encoded.header,
                             payload=payload, payload_crc=crc)
        item.codec, item.runs_on, item.kernel_compute_s = kernel.name, kernel.runs_on, seconds
        return item

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _timed_encode(codec: Codec, raw: np.ndarray):
    """(encoded, its payload's bytes, their CRC32C, the encode's seconds), all made in the worker thread: the
    CRC here spares the event loop a pass over the output. The seconds are the real host time the kernel
    took (exported beside the module's modelled time, the fidelity guard compares them)."""
    start = time.perf_counter()
    encoded = codec.encode(raw)
    seconds = time.perf_counter() - start
    payload = byte_view(encoded.payload)
    return encoded, payload, crc32c(payload), seconds
