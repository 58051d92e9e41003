"""The codec run on a GPU instead of in transit (`compress_at="gpu"`, the all-GPU baseline): its work on one
request's KV, forward at the prefill GPU and inverse at the decode GPU, and the roofline time of that work when it
is fused into the step that makes (or admits) the KV, so it pays no step overhead of its own.

A documented model, not from docs/reference.md; the rules are in each function. Pure: no I/O.
"""

from __future__ import annotations

from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.models import ModelSpec
from kvtransit.model.cost.roofline import StepWork, step_time
from kvtransit.model.module.budget import KernelDeclaration

# A requantiser's decode is one multiply by its block's scale per value (documented model; see
# Scenario.gpu_codec_inverse_work): the most per-value work an inverse is charged besides its transform.
INVERSE_OPS_PER_VALUE = 1


def forward_work(decl: KernelDeclaration, model: ModelSpec, prompt_tokens: int) -> StepWork:
    """The prefill GPU's codec as GPU work, on the full-size (model) KV of one request.

    The GPU pays every operation the declaration lists *and* the transform (no passive optics there), i.e.
    (ops_per_byte + 1.25·log2 N) per input byte (docs/reference.md §5 kernel table), and streams the KV through HBM once
    in and once out (read the input, write the compressed output).
    """
    input_bytes = model.kv_bytes(prompt_tokens)
    flops = input_bytes * (decl.ops_per_byte + decl.transform_ops_per_byte)
    return StepWork(float(flops), float(input_bytes + input_bytes / decl.ratio))


def inverse_work(decl: KernelDeclaration, model: ModelSpec, prompt_tokens: int) -> StepWork:
    """Decode's GPU undoing the codec on one request's KV, when it admits it.

    The inverse transform costs what the forward does, 1.25·log2 N per input byte when there is one (docs/reference.md
    §5 kernel table; an inverse FFT/DCT is the same butterfly count). The declaration's other per-value work reverses in
    at most one op per value: a requantiser's decode (fp8, fp4-block) is one multiply by its block's scale per value, so
    fp8 (1 op per value forward) costs the same back and fp4-block (2 forward) costs 1; band-keep declares none (its
    gather/scatter is wiring). A value is the model's KV value (BF16, 2 bytes, docs/reference.md §1).
    HBM: the GPU reads the compressed KV and writes the full-size KV once.
    """
    full_bytes = model.kv_bytes(prompt_tokens)
    per_value_ops_per_byte = min(decl.ops_per_byte, INVERSE_OPS_PER_VALUE / model.bytes_per_value)
    flops = full_bytes * (decl.transform_ops_per_byte + per_value_ops_per_byte)
    return StepWork(float(flops), float(full_bytes / decl.ratio + full_bytes))


def fused_s(work: StepWork, device: Device, gpus: int) -> float:
    """The roofline time of `work` with no step overhead: it is fused into a step the model already holds."""
    t = step_time(work, device, gpus)
    return max(t.compute_s, t.memory_s)
