"""GPUs the roofline cost model knows (docs/reference.md §3)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtransit.model.errors import ConfigError, require_positive, unknown_name

TERA = 1e12
GB = 1e9


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # dense BF16, FLOP/s
    hbm_Bps: float
    hbm_bytes: float
    tdp_w: float
    idle_w: float
    pj_per_flop: float
    pj_per_byte: float  # per HBM byte moved

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a device needs a name")
        for field_name in ("peak_flops", "hbm_Bps", "hbm_bytes", "tdp_w"):
            require_positive(f"device {self.name!r}: {field_name}", getattr(self, field_name))
        for field_name in ("idle_w", "pj_per_flop", "pj_per_byte"):
            if not getattr(self, field_name) >= 0:
                raise ConfigError(f"device {self.name!r}: {field_name} must be >= 0")


# docs/reference.md §3: peak BF16, HBM bandwidth, HBM size, TDP, idle, pJ/FLOP, pJ/byte.
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("h100", 989 * TERA, 3.35 * TERA, 80 * GB, 700.0, 100.0, 1.0, 60.0),
        Device("a100", 312 * TERA, 2.039 * TERA, 80 * GB, 400.0, 60.0, 1.6, 70.0),
        Device("h200", 989 * TERA, 4.8 * TERA, 141 * GB, 700.0, 100.0, 1.0, 60.0),
        Device("b200", 2250 * TERA, 8 * TERA, 180 * GB, 1000.0, 140.0, 0.6, 45.0),
    )
}


def device_by_name(name: str) -> Device:
    try:
        return DEVICES[name]
    except KeyError:
        raise unknown_name("device", name, DEVICES) from None
