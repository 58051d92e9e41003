"""The run's one frozen configuration, built once and passed to every process (uvicorn's `Config` is the model).

A `Scenario` names the model, GPUs, link, codec, module, workload, pool sizes and the emulation's scale and
dilation. It validates itself on construction (a `ConfigError` naming the field and the valid choices) and
derives everything the processes need: the scaled KV layout, the scaled link, the workload.

Its fields are the core's; each registered flow (kvtransit/flows/__init__.py: FLOWS) adds a `Section` of its own
(model/sections.py), held in `sections`, whose fields are scenario fields like any other: flat names, a flag each,
written by `to_argv` and read back by `field_from_text`, listed flat in the report's config block. `Scenario(...)`
takes the core's fields; `Scenario.build(...)` and `replace(...)` take any field by its flat name, core or flow.

Scale and dilation (ARCHITECTURE.md, time and scale): scale shrinks each request's KV along its channels, never its
tokens; dilation d ≥ 1 stretches every modelled duration by d and divides link rates by d; reports divide back. How
channels and dilation are chosen (and `scale="auto"`) is `kv_scale.py`; a field read from text is `scenario_text.py`; a
field's range and choice checks are `field_checks.py`; the codec's cost when it runs on a GPU is `gpu_codec.py`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from dataclasses import replace as replace_fields
from functools import cache
from typing import Any, TypeVar

from kvtransit.model.catalog.codecs import CODEC_NAMES, codec_declaration
from kvtransit.model.catalog.devices import DEVICES, Device, device_by_name
from kvtransit.model.catalog.links import LINKS, Link, link_by_name
from kvtransit.model.catalog.models import MODELS, ModelSpec, model_by_name
from kvtransit.model.cost import gpu_codec
from kvtransit.model.cost.roofline import StepWork, kv_capacity_tokens
from kvtransit.model.errors import ConfigError, unknown_name
from kvtransit.model.field_checks import choice, module_budget, number
from kvtransit.model.judge.slo import TPOT_SLO_S, TTFT_SLO_S
from kvtransit.model.kv_scale import (
    DILATION_QUANTUM,
    HOST_BUDGET_BPS,
    KvLayout,
    auto_channels_and_dilation,
    channels_for_scale,
    require_one_channel,
    scaled_layout,
)
from kvtransit.model.module.budget import (
    PLACEMENTS,
    PRECISION_BITS_RANGE,
    SIM_ADDED_LATENCY_S,
    SIM_PJ_PER_INPUT_BIT,
    Action,
    BudgetResult,
    KernelDeclaration,
    Module,
    Policy,
    budget_check,
    budget_ops_per_byte,
    transit_time,
)
from kvtransit.model.sections import Section
from kvtransit.model.serving.layerwise import HANDOFF_MODES, HANDOFF_WHOLE
from kvtransit.model.serving.policies import PREFILL_BATCH_TOKEN_LIMIT
from kvtransit.model.serving.traces import BLOCK_TOKENS, TRACE_FORMATS, TRACE_SAMPLING
from kvtransit.model.serving.workload import ARRIVALS, DEFAULT_MAX_TOKENS, LengthDist, WorkloadSpec

COMPRESS_AT = ("transit", "gpu")
# A prefill chunk holds at least one KV block (model/serving/traces.py: 512 tokens, the unit the prefix cache stores)
# and at most one step's token budget (docs/reference.md §4: 8,192).
PREFILL_CHUNK_RANGE = (BLOCK_TOKENS, PREFILL_BATCH_TOKEN_LIMIT)
# Band-keep transforms along tokens (docs/reference.md §6.1: FFT or DCT-II); the kernels layer implements both.
BAND_KEEP_VARIANTS = ("dct", "fft")
POLICIES = tuple(p.value for p in Policy)
NONE_TEXT = "none"
AUTO = "auto"
SYNTHETIC_KV = "synthetic"
# `kv_sample` "real": the first `real_kv_requests` requests carry the real model's own KV over real text
# (realmodel/live.py), the others synthetic KV; `accuracy` "model": decode feeds the KV that arrived through
# the middlebox into the real model and scores its predictions ("reconstruction": the codec's error only).
REAL_MODEL_KV = "real"
ACCURACY_MODES = ("reconstruction", "model")

S = TypeVar("S", bound=Section)


@dataclass(frozen=True)
class Scenario:
    # What is served, on what.
    model: str = "llama3-8b"
    device: str = "h100"
    gpus: int = 1
    prefill: int = 1  # prefill instances
    decode: int = 1  # decode instances
    # An instance as a tensor-parallel group of N GPUs over the scale-up link (1: one process whose `gpus` GPUs share
    # nothing over a link, docs/reference.md §3): its roofline runs on N GPUs; the group's ranks and its collectives are
    # the tp flow's (flows/tp/: the follower processes, the all-reduces as real bytes, and its section's fields: how the
    # group sums, over which link, expert parallelism). A prefill group's all-reduces are over every token it computes
    # (docs/reference.md §7).
    decode_tp: int = 1
    prefill_tp: int = 1
    # The hand-off link and what runs on it.
    link: str = "eth-25g"
    channels: int = 1  # parallel link channels (docs/reference.md §4: one shared FIFO link by default)
    # How the KV is released to the link (model/serving/layerwise.py): "whole" at the end of its prefill step
    # (the reference model, docs/reference.md §4), or "layerwise": each layer as its compute ends, step start + (l+1)/L
    # × step.
    handoff: str = HANDOFF_WHOLE
    # Chunked prefill: prompts computed at most this many tokens a step, each chunk's KV released by its own step's
    # schedule (0: off, a prompt in one step as docs/reference.md §4 has it). From one KV block to a step's token
    # budget.
    prefill_chunk: int = 0
    codec: str = "freq-keep-k"
    keep: float = 0.5
    sinks: int = 4  # attention-sink tokens kept exact (docs/reference.md §6)
    block: int = 64  # tokens per transform block (freq-keep-k) or values per scale (fp4-block)
    variant: str = "dct"
    compress_at: str = "transit"
    # The module and its unknowns (docs/reference.md §5), so a live run honours them from its start (no `PUT /kernel`).
    # module_budget: ops per line byte the module affords at line rate: "low" (0.40), "sim" (1.6, the
    # simulator's stage), "high" (3.96), or a number > 0 (a string that parses as one is taken as that number).
    module_budget: str | float = "sim"
    policy: str = "reject"  # a kernel needing an unpublished op: rejected, or run on the host
    module_pj_per_bit: float = SIM_PJ_PER_INPUT_BIT  # pJ per input bit (the simulator's 1 pJ)
    module_latency_us: float = SIM_ADDED_LATENCY_S * 1e6  # added latency, µs (the simulator's 1 µs)
    # Does the transform count against the budget? False: passive optics, the FFT is free (the simulator's
    # stage); True: 1.25·log2 N ops per byte (the kernel table's "transform charged").
    transform_charged: bool = False
    precision_bits: int | None = None  # what the analogue path delivers (None: exact); 1..32
    placement: str = "pluggable"  # "pluggable" (sees one stream) or "switch" (sees many, can sum them)
    # The kernel file whose declaration set the codec fields above ("" = none): a record for the report, never
    # read by the processes (`--kernel FILE` maps it, model/module/kernel_runs.py; the children get the mapped fields).
    kernel_file: str = ""
    # The workload (docs/reference.md §4 definitions; a shorter, lighter default than the simulator's 800 requests so
    # that `kvtransit up` ends in about a minute).
    rate: float = 2.0
    arrival: str = "poisson"
    burstiness: float = 1.0
    requests: int = 100
    prompt_mean: float = 2048.0
    prompt_cv: float = 0.5
    output_mean: float = 256.0
    output_cv: float = 0.5
    seed: int = 1
    max_concurrency: int = 0  # 0: unlimited (open loop)
    # Emulation.
    scale: float | str = AUTO
    dilation: float = 1.0
    # KV content: "synthetic" templates, or the path of a real-KV sample (.npz, e.g.
    # tests/data/smollm2_kv_sample.npz) whose channels seed the templates instead.
    kv_sample: str = SYNTHETIC_KV
    accuracy: str = "reconstruction"
    real_kv_requests: int = 4
    # A request trace to replay instead of the drawn workload ("" = none; model/serving/traces.py): `requests` of its
    # requests (the first N, or N at random), arrivals × time_scale, prompts capped at context_cap tokens.
    trace: str = ""
    trace_format: str = "auto"
    trace_sample: str = "first"
    time_scale: float = 1.0
    context_cap: int = DEFAULT_MAX_TOKENS
    trace_start: int = 0  # the replay window's first request in the trace (the requests before it are its past)
    # The SLO the report judges by (docs/reference.md §4: TTFT 1 s, TPOT 25 ms); `--goodput ttft:MS tpot:MS` sets them.
    ttft_slo_ms: float = TTFT_SLO_S * 1e3
    tpot_slo_ms: float = TPOT_SLO_S * 1e3
    # Each registered flow's section (model/sections.py), in registry order; every flow absent here gets its
    # defaults (the flow off). Build with `Scenario.build(**flat)` to set a flow's fields by their flat names.
    sections: tuple[Section, ...] = ()

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"model: {unknown_name('model', self.model, MODELS)}")
        if self.device not in DEVICES:
            raise ConfigError(f"device: {unknown_name('device', self.device, DEVICES)}")
        if self.link not in LINKS:
            raise ConfigError(f"link: {unknown_name('link', self.link, LINKS)}")
        choice("codec", self.codec, CODEC_NAMES)
        choice("variant", self.variant, BAND_KEEP_VARIANTS)
        choice("compress_at", self.compress_at, COMPRESS_AT)
        choice("handoff", self.handoff, HANDOFF_MODES)
        object.__setattr__(self, "module_budget", module_budget(self.module_budget))
        choice("policy", self.policy, POLICIES)
        number("module_pj_per_bit", self.module_pj_per_bit, lo=0)
        number("module_latency_us", self.module_latency_us, lo=0)
        if not isinstance(self.transform_charged, bool):
            raise ConfigError(f"transform_charged: expected yes or no (a bool), got {self.transform_charged!r}")
        if self.precision_bits is not None:
            lo, hi = PRECISION_BITS_RANGE
            object.__setattr__(self, "precision_bits",
                               number("precision_bits", self.precision_bits, lo=lo, hi=hi, integer=True))
        choice("placement", self.placement, PLACEMENTS)
        choice("arrival", self.arrival, ARRIVALS)
        for name in ("gpus", "prefill", "decode", "channels", "requests", "decode_tp", "prefill_tp"):
            object.__setattr__(self, name, number(name, getattr(self, name), lo=1, integer=True))
        object.__setattr__(self, "sinks", number("sinks", self.sinks, lo=0, integer=True))
        object.__setattr__(self, "prefill_chunk", number("prefill_chunk", self.prefill_chunk, integer=True))
        if self.prefill_chunk and not PREFILL_CHUNK_RANGE[0] <= self.prefill_chunk <= PREFILL_CHUNK_RANGE[1]:
            lo, hi = PREFILL_CHUNK_RANGE
            raise ConfigError(f"prefill_chunk: {self.prefill_chunk} tokens is outside {lo}..{hi} (one KV block .. a "
                              f"prefill step's token budget), or 0 for no chunking")
        if self.prefill_chunk and self.codec == "freq-keep-k" and self.sinks > self.prefill_chunk:
            # Each chunk's KV is its own band-keep input, whose first `sinks` tokens are kept exact.
            raise ConfigError(f"prefill_chunk: {self.prefill_chunk} tokens is fewer than the {self.sinks} sink tokens "
                              f"freq-keep-k keeps exact in each chunk's KV; give at least {self.sinks}")
        object.__setattr__(self, "block", number("block", self.block, lo=2, integer=True))
        object.__setattr__(self, "seed", number("seed", self.seed, integer=True))
        object.__setattr__(self, "max_concurrency",
                           number("max_concurrency", self.max_concurrency, lo=0, integer=True))
        number("keep", self.keep, lo=0, hi=1, lo_open=True)
        for name in ("rate", "burstiness", "prompt_mean", "output_mean"):
            number(name, getattr(self, name), lo=0, lo_open=True)
        for name in ("prompt_cv", "output_cv"):
            number(name, getattr(self, name), lo=0)
        number("dilation", self.dilation, lo=1)
        choice("trace_format", self.trace_format, TRACE_FORMATS)
        choice("trace_sample", self.trace_sample, TRACE_SAMPLING)
        for name in ("time_scale", "ttft_slo_ms", "tpot_slo_ms"):
            number(name, getattr(self, name), lo=0, lo_open=True)
        object.__setattr__(self, "context_cap", number("context_cap", self.context_cap, lo=1, integer=True))
        object.__setattr__(self, "trace_start", number("trace_start", self.trace_start, lo=0, integer=True))
        if self.trace_start and not self.trace:
            raise ConfigError(f"trace_start: {self.trace_start} needs a trace to start in (--trace FILE)")
        if not self.kv_sample:
            raise ConfigError(f"kv_sample: expected {SYNTHETIC_KV!r}, {REAL_MODEL_KV!r} or the path of a KV sample "
                              "(.npz), got ''")
        choice("accuracy", self.accuracy, ACCURACY_MODES)
        object.__setattr__(self, "real_kv_requests", number("real_kv_requests", self.real_kv_requests, lo=1,
                                                            integer=True))
        if self.accuracy == "model" and self.kv_sample != REAL_MODEL_KV:
            raise ConfigError(f"accuracy: 'model' needs kv_sample {REAL_MODEL_KV!r} (the real model reads only its own "
                              f"KV), got kv_sample {self.kv_sample!r}")
        if self.kv_sample == REAL_MODEL_KV and self.prefill_chunk:
            raise ConfigError(f"kv_sample: {REAL_MODEL_KV!r} does not combine with prefill_chunk "
                              f"({self.prefill_chunk}): the real model's KV is made whole, not a chunk at a time")
        if self.scale != AUTO:
            if isinstance(self.scale, str):
                raise ConfigError(f"scale: expected a number in (0, 1] or {AUTO!r}, got {self.scale!r}")
            number("scale", self.scale, lo=0, hi=1, lo_open=True)
            require_one_channel(self.model_spec, self.scale)
        self.codec_declaration  # noqa: B018 — the codec's own checks (e.g. fp4 block) run now, not mid-run
        if self.kv_capacity_tokens < 1:
            raise ConfigError(
                f"gpus: {self.model} does not fit on {self.gpus}x {self.device} (no room left for KV); give more gpus"
            )
        object.__setattr__(self, "sections", _complete(self.sections))
        for section in self.sections:  # each flow's cross-field checks, after the core's
            section.check(self)

    # --- the flows' sections ------------------------------------------------------------------------------
    @classmethod
    def build(cls, **values: Any) -> Scenario:
        """A scenario from fields by their flat names, the core's and every flow's."""
        return cls(**_split(values))

    def replace(self, **values: Any) -> Scenario:
        """This scenario with some fields, core or flow, changed (by their flat names)."""
        return type(self).build(**{**self.as_dict(), **values})

    def section(self, kind: type[S]) -> S:
        """The section of flow class `kind` (every registered flow's is there, the flow on or off)."""
        for section in self.sections:
            if isinstance(section, kind):
                return section
        raise KeyError(f"{kind.__name__} is not a registered flow's section (kvtransit/flows/__init__.py)")

    @property
    def enabled_sections(self) -> tuple[Section, ...]:
        """The sections of the flows this scenario turns on, in registry order."""
        return tuple(s for s in self.sections if s.enabled(self))

    @property
    def flows(self) -> tuple[str, ...]:
        """The names of the flows this scenario turns on."""
        return tuple(s.FLOW for s in self.enabled_sections)

    def brings_prompts(self) -> bool:
        """Does something other than the drawn workload give the requests their prompts (a trace, a flow's)?"""
        return bool(self.trace) or any(s.brings_prompts() for s in self.enabled_sections)

    # --- catalogue entries ---------------------------------------------------------------------------------
    @property
    def model_spec(self) -> ModelSpec:
        return model_by_name(self.model)

    @property
    def device_spec(self) -> Device:
        return device_by_name(self.device)

    @property
    def link_spec(self) -> Link:
        """The modelled link (unscaled): what the report's configured figures and energy refer to."""
        return link_by_name(self.link)

    @property
    def module_budget_ops_per_byte(self) -> float:
        return budget_ops_per_byte(self.module_budget)

    @property
    def module(self) -> Module:
        """The module the run's middlebox charges: budget, energy per input bit, added latency (docs/reference.md
        §5)."""
        return Module(ops_per_byte=self.module_budget_ops_per_byte, pj_per_input_bit=self.module_pj_per_bit,
                      added_latency_s=self.module_latency_us * 1e-6)

    @property
    def codec_declaration(self) -> KernelDeclaration:
        """The codec as the module is charged for it: the preset with this scenario's transform_charged,
        precision_bits and placement (the same declaration the middlebox's kernel stage judges)."""
        # `block` is band-keep's transform length; fp4-block's own block is fixed by its format (MXFP4).
        decl = codec_declaration(self.codec, keep=self.keep, transform_length=self.block,
                                 transform=self.variant)
        return replace_fields(decl, transform_charged=self.transform_charged, precision_bits=self.precision_bits,
                              placement=self.placement)

    @property
    def module_verdict(self) -> BudgetResult | None:
        """The module's verdict on the codec, or None when the module runs nothing (codec none, or at the GPU)."""
        if self.codec == "none" or self.compress_at != "transit":
            return None
        return budget_check(self.codec_declaration, self.module, Policy(self.policy))

    def module_terms(self) -> dict[str, Any]:
        """The report's `config.module` block: what the module affords, what the codec is charged, the verdict,
        and whether the module's compute outlasts the wire (`transit_bound`, docs/reference.md §5: "when the second
        term wins", i.e. ops / (budget × bw) > wire / bw; `compute_over_wire` is that ratio, independent of the
        bytes: charged × ratio / budget)."""
        verdict = self.module_verdict
        in_transit = verdict is not None and verdict.action is Action.IN_TRANSIT
        decl = self.codec_declaration
        timing = transit_time(1, decl, self.link_spec.bandwidth_Bps, self.link_spec.latency_s, self.module)
        compute_over_wire = timing.compute_s / timing.wire_s if in_transit else 0.0
        return {
            "budget": self.module_budget,
            "budget_ops_per_byte": self.module_budget_ops_per_byte,
            "charged_ops_per_byte": decl.charged_ops_per_byte if in_transit else 0.0,
            "transform_charged": self.transform_charged,
            "precision_bits": self.precision_bits,
            "placement": self.placement,
            "pj_per_input_bit": self.module_pj_per_bit,
            "added_latency_s": self.module_latency_us * 1e-6,
            "runs": "none" if verdict is None else verdict.action.value,
            "verdict": None if verdict is None else verdict.verdict.value,
            "compute_over_wire": compute_over_wire,
            "transit_bound": in_transit and timing.transit_bound,
        }

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens one instance of `gpus` GPUs holds (docs/reference.md §3)."""
        return kv_capacity_tokens(self.model_spec, self.device_spec, self.gpus)

    @property
    def prefill_gpus(self) -> int:
        """The GPUs of one prefill instance: its TP group's (`prefill_tp` > 1), else `gpus`."""
        return self.prefill_tp if self.prefill_tp > 1 else self.gpus

    @property
    def decode_gpus(self) -> int:
        """The GPUs of one decode instance: its TP group's (`decode_tp` > 1), else `gpus`."""
        return self.decode_tp if self.decode_tp > 1 else self.gpus

    @property
    def decode_kv_capacity_tokens(self) -> int:
        """KV tokens one decode instance holds (docs/reference.md §3), on its `decode_gpus`."""
        return kv_capacity_tokens(self.model_spec, self.device_spec, self.decode_gpus)

    # --- the codec on a GPU (compress_at="gpu"): its work and roofline time, model/cost/gpu_codec.py ------------
    def gpu_codec_work(self, prompt_tokens: int) -> StepWork:
        """The prefill GPU's codec on one request's full-size KV (the all-GPU baseline)."""
        return gpu_codec.forward_work(self.codec_declaration, self.model_spec, prompt_tokens)

    def gpu_codec_s(self, prompt_tokens: int) -> float:
        if self.compress_at != "gpu" or self.codec == "none":
            return 0.0
        return gpu_codec.fused_s(self.gpu_codec_work(prompt_tokens), self.device_spec, self.prefill_gpus)

    def gpu_codec_inverse_work(self, prompt_tokens: int) -> StepWork:
        """Decode's GPU undoing that codec on one request's KV, when it admits it."""
        return gpu_codec.inverse_work(self.codec_declaration, self.model_spec, prompt_tokens)

    def gpu_codec_inverse_s(self, prompt_tokens: int) -> float:
        """0 unless the codec ran on the prefill GPU; fused into the decode step that admits the request."""
        return self._gpu_inverse_s(prompt_tokens, self.decode_gpus)

    def _gpu_inverse_s(self, tokens: int, gpus: int) -> float:
        if self.compress_at != "gpu" or self.codec == "none" or tokens <= 0:
            return 0.0
        return gpu_codec.fused_s(self.gpu_codec_inverse_work(tokens), self.device_spec, gpus)

    def gpu_codec_fetch_inverse_s(self, cached_tokens: int) -> float:
        """The prefill GPU undoing its codec on a cached prefix fetched compact from the KV pool (--compress-at gpu
        compressed the write-back there): the same inverse work as decode's, on the prefill's GPUs, before the
        request's compute can read the prefix. 0 unless the codec runs on the GPU."""
        return self._gpu_inverse_s(cached_tokens, self.prefill_gpus)

    @property
    def kv_sample_path(self) -> str | None:
        """The real-KV sample seeding the KV content, or None for synthetic templates."""
        return None if self.kv_sample in (SYNTHETIC_KV, REAL_MODEL_KV) else self.kv_sample

    def carries_real_kv(self, request_id: int) -> bool:
        """Does this request's hand-off carry the real model's own KV (`kv_sample` "real": the first
        `real_kv_requests` request ids), so that decode can read it with the real model?"""
        return self.kv_sample == REAL_MODEL_KV and 0 <= request_id < self.real_kv_requests

    # --- scale and dilation -------------------------------------------------------------------------------
    def _channels_and_dilation(self) -> tuple[int, float]:
        model = self.model_spec
        scale = self.scale
        if isinstance(scale, str):  # AUTO, the one string __post_init__ lets through
            return auto_channels_and_dilation(model, self.link_spec, self.dilation, HOST_BUDGET_BPS)
        return channels_for_scale(model, scale), self.dilation

    @property
    def kv_layout(self) -> KvLayout:
        return scaled_layout(self.model_spec, self._channels_and_dilation()[0])

    @property
    def effective_scale(self) -> float:
        """channels at scale / (kv_heads × head_dim), exactly."""
        return self.kv_layout.channels / self.model_spec.kv_dim

    @property
    def effective_dilation(self) -> float:
        """The dilation in force: as given, or raised by `scale="auto"` when one channel is too fast."""
        return self._channels_and_dilation()[1]

    @property
    def scaled_link(self) -> Link:
        """The link the emulation shapes: rate × effective scale ÷ dilation, latency × dilation."""
        link = self.link_spec
        return Link(
            name=f"{link.name}@scale",
            bandwidth_Bps=link.bandwidth_Bps * self.effective_scale / self.effective_dilation,
            latency_s=link.latency_s * self.effective_dilation,
            pj_per_bit=link.pj_per_bit,
        )

    @property
    def real_size_dilation(self) -> float:
        """The dilation that runs this scenario's link at `--scale 1` within `HOST_BUDGET_BPS` (at least 1): the
        same rule as `scale="auto"`, applied to every channel of the model's KV at once."""
        needed = self.link_spec.bandwidth_Bps / HOST_BUDGET_BPS
        return max(1.0, math.ceil(needed / DILATION_QUANTUM - 1e-9) * DILATION_QUANTUM)

    def wall_s(self, model_s: float) -> float:
        """A modelled duration as held on the wall clock (× dilation)."""
        return model_s * self.effective_dilation

    def model_s(self, wall_s: float) -> float:
        """A measured wall-clock duration in model seconds (÷ dilation)."""
        return wall_s / self.effective_dilation

    # --- workload -----------------------------------------------------------------------------------------
    @property
    def workload(self) -> WorkloadSpec:
        return WorkloadSpec(
            rate=self.rate,
            requests=self.requests,
            prompt=LengthDist(self.prompt_mean, self.prompt_cv),
            output=LengthDist(self.output_mean, self.output_cv),
            seed=self.seed,
            arrival=self.arrival,
            burstiness=self.burstiness,
        )

    # --- the same flags for every process -----------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        """Every field by its flat name, the core's then each flow's (the report's config block, the codecs')."""
        values = {name: getattr(self, name) for name in _core_names()}
        for section in self.sections:
            values.update(section.as_dict())
        return values

    def to_argv(self) -> list[str]:
        """Every field as a command-line flag (`--prompt-mean 2048`), so each process sees this exact scenario."""
        argv: list[str] = []
        for name, value in self.as_dict().items():
            argv += [flag_for(name), _format_value(value)]
        return argv

    def describe(self) -> dict[str, Any]:
        """The config block of a report: every field plus what was derived from it."""
        layout = self.kv_layout
        return {
            **self.as_dict(),
            "effective_scale": self.effective_scale,
            "effective_dilation": self.effective_dilation,
            "kv_channels": layout.channels,
            "kv_layout": [layout.layers, 2, layout.kv_heads, "tokens", layout.head_dim],
            "scaled_link_Bps": self.scaled_link.bandwidth_Bps,
            "configured_link_Bps": self.link_spec.bandwidth_Bps,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "codec_ratio": self.codec_declaration.ratio,
            "host_budget_Bps": HOST_BUDGET_BPS,
            "real_size_dilation": self.real_size_dilation,
            "module": self.module_terms(),
            **{k: v for section in self.enabled_sections for k, v in section.describe(self).items()},
        }


# Flags that are not just the field's name: `--prefill` / `--decode` name peer addresses on the agents'
# command lines (e.g. `kvtransit middlebox --decode HOST:PORT`), so the pool sizes say what they count.
_FLAG_NAMES = {"prefill": "--prefill-instances", "decode": "--decode-instances"}


def flag_for(field_name: str) -> str:
    return _FLAG_NAMES.get(field_name, "--" + field_name.replace("_", "-"))


def _format_value(value: object) -> str:
    if isinstance(value, float):
        return repr(value)  # round-trips exactly
    return str(value)


@dataclass(frozen=True)
class ScenarioField:
    """One scenario field: its flat name, default, flag help, and the flow that owns it ("" for the core's)."""

    name: str
    default: Any
    help: str = ""
    flow: str = ""

    @property
    def flag(self) -> str:
        return flag_for(self.name)


@cache
def _core_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Scenario) if f.name != "sections")


@cache
def section_classes() -> tuple[type[Section], ...]:
    """Every registered flow's section class, in registry order (kvtransit.flows: loaded by name, on first use)."""
    from kvtransit import flows  # the registry only: the core reaches a flow through it, by a string

    return tuple(module.SECTION for _, module in flows.faces("section"))


@cache
def scenario_fields() -> tuple[ScenarioField, ...]:
    """Every scenario field, the core's then each flow's: the flags, the text codec and the report read these."""
    core = [ScenarioField(f.name, f.default) for f in fields(Scenario) if f.name != "sections"]
    flow = [ScenarioField(f.name, f.default, kind.HELP.get(f.name, ""), kind.FLOW)
            for kind in section_classes() for f in fields(kind)]
    names = [f.name for f in core + flow]
    clash = sorted({n for n in names if names.count(n) > 1})
    assert not clash, f"scenario fields defined twice: {clash}"
    return tuple(core + flow)


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in scenario_fields())


def _owner() -> Mapping[str, type[Section]]:
    return {name: kind for kind in section_classes() for name in kind.field_names()}


def _split(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat field values → Scenario's keyword arguments: the core's as they are, each flow's into its section."""
    owner = _owner()
    core: dict[str, Any] = {}
    by_section: dict[type[Section], dict[str, Any]] = {}
    for name, value in values.items():
        if name in owner:
            by_section.setdefault(owner[name], {})[name] = value
        elif name in _core_names() or name == "sections":
            core[name] = value
        else:
            raise ConfigError(f"unknown scenario field {name!r} (choose from: {', '.join(field_names())})")
    if by_section:
        given = {type(s): s for s in core.get("sections", ())}
        core["sections"] = tuple(replace_fields(given[kind], **fields_) if kind in given else kind(**fields_)
                                 for kind, fields_ in by_section.items()) + tuple(
            s for kind, s in given.items() if kind not in by_section)
    return core


def _complete(sections: tuple[Section, ...]) -> tuple[Section, ...]:
    """One section per registered flow, in registry order: those given, the defaults (the flow off) for the rest."""
    given = {type(s): s for s in sections}
    unknown = [kind.__name__ for kind in given if kind not in section_classes()]
    if unknown or len(given) != len(sections):
        got = [type(s).__name__ for s in sections]
        raise ConfigError(f"sections: expected at most one section of each registered flow, got {got}")
    return tuple(given.get(kind) or kind() for kind in section_classes())
