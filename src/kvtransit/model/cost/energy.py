"""Energy of moving and computing on KV bytes (docs/reference.md §3, §5). One formula per place energy is spent."""

from __future__ import annotations

from kvtransit.model.catalog.devices import Device
from kvtransit.model.catalog.links import Link
from kvtransit.model.errors import ConfigError
from kvtransit.model.module.budget import Module

PJ = 1e-12


def _non_negative(name: str, value: float) -> float:
    if not value >= 0:
        raise ConfigError(f"{name} must be >= 0, got {value!r}")
    return value


def link_energy_j(link: Link, wire_bytes: float) -> float:
    """Wire bits × the link's pJ per bit (docs/reference.md §5)."""
    return link.energy_j(wire_bytes)


def module_energy_j(module: Module, input_bytes: float) -> float:
    """Input bits × the module's pJ per input bit (1 pJ in the simulator's stage, docs/reference.md §5)."""
    return module.energy_j(_non_negative("module input bytes", input_bytes))


def handoff_module_energy_j(module: Module, input_bytes: float, wire_bytes: float) -> float:
    """Both module stages of an in-transit hand-off: the encoding module's input bits plus the decoding
    module's at the far end, whose input is the wire bytes, each × the module's pJ per input bit.

    docs/reference.md §5's stage formula counts one stage on the link; physically the bytes are decoded at the
    receiving end by a second module (a pluggable at decode's end: an inverse there costs the same per input
    bit). A documented model. Its time is pipelined with the first stage (same bytes, same budget),
    so the hand-off time formula (module.transit_time) is unchanged.
    """
    return module_energy_j(module, input_bytes) + module_energy_j(module, wire_bytes)


def gpu_energy_j(device: Device, flops: float, hbm_bytes: float) -> float:
    """FLOPs × pJ/FLOP + HBM bytes × pJ/byte (docs/reference.md §3 device table)."""
    _non_negative("FLOPs", flops)
    _non_negative("HBM bytes", hbm_bytes)
    return (flops * device.pj_per_flop + hbm_bytes * device.pj_per_byte) * PJ
